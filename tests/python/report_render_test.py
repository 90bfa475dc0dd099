"""The HTML report renders in a real browser: headless Chromium takes a screenshot of `ckplan report` on the
bundled profile, and the page must show its figures (the optimal curve's red, the per-module bars' blue),
its table text and no blank page. Also checks the Markdown and JSON forms. The report and the screenshot
are made once, in module-scoped fixtures; each test checks one thing of them.

    pytest tests/python/report_render_test.py --ckplan BUILD/ckplan --profile data/example.profile.json
"""
import json
import os
import shutil
import subprocess

import pytest
from PIL import Image

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREEN = (900, 2000)


@pytest.fixture(scope="module")
def report(ckplan, profile, tmp_path_factory):
    """`ckplan report PROFILE -o report.html`: (the finished process, the HTML's path)."""
    html = str(tmp_path_factory.mktemp("report") / "report.html")
    result = subprocess.run([ckplan, "report", profile, "-o", html], capture_output=True, text=True)
    return result, html


@pytest.fixture(scope="module")
def page(report):
    """The report's HTML text; fails when ckplan report did not write it."""
    result, html = report
    assert result.returncode == 0, f"ckplan report exited {result.returncode}: {result.stderr.strip()}"
    with open(html) as f:
        return f.read()


@pytest.fixture(scope="module")
def screenshot(page, report):
    """Headless Chromium's screenshot of the report, SCREEN pixels: (the finished process, the PNG's path)."""
    _, html = report
    work = os.path.dirname(html)
    png = os.path.join(work, "report.png")
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={os.path.join(work, 'profile')}", f"--window-size={SCREEN[0]},{SCREEN[1]}",
               f"--screenshot={png}", "file://" + html]
    return subprocess.run(command, capture_output=True, text=True, timeout=120), png


@pytest.fixture(scope="module")
def image(screenshot):
    """The screenshot as RGB; fails when Chromium took none."""
    shot, png = screenshot
    assert shot.returncode == 0 and os.path.exists(png), \
        f"Chromium exited {shot.returncode} and wrote {'a' if os.path.exists(png) else 'no'} screenshot: " \
        f"{shot.stderr.strip()[-300:]}"
    return Image.open(png).convert("RGB")


def count_near(image, rgb, tolerance=40):
    """The pixels within `tolerance` of `rgb` in each channel."""
    r0, g0, b0 = rgb
    return sum(count for count, (r, g, b) in image.getcolors(maxcolors=1 << 24)
               if abs(r - r0) <= tolerance and abs(g - g0) <= tolerance and abs(b - b0) <= tolerance)


def test_report_exits_0(report):
    """`ckplan report` on the profile exits 0 and writes the HTML file."""
    result, html = report
    assert result.returncode == 0, f"ckplan report exited {result.returncode}: {result.stderr.strip()}"
    assert os.path.getsize(html) > 0, f"ckplan report wrote an empty {html}"


def test_three_inline_svg_figures(page):
    """The page holds three inline SVG figures."""
    count = page.count("<svg")
    assert count == 3, f"{count} inline SVG figures, expected 3"


def test_self_contained(page):
    """No script and no network address (beside the SVG namespace)."""
    assert "<script" not in page, "the report has a script"
    outside = page.replace("http://www.w3.org/2000/svg", "")
    assert "http://" not in outside, f"the report reaches the network: {outside[outside.find('http://'):][:80]}"


@pytest.mark.parametrize("label", ["peak memory of the step (MiB)", "step time (ms)", "memory (MiB)"],
                         ids=["peak_memory", "step_time", "memory"])
def test_axis_labelled(page, label):
    """Each axis label of the figures is in the page."""
    assert label in page, f"no axis labelled '{label}'"


def test_chromium_takes_a_screenshot(screenshot):
    """Headless Chromium exits 0 and writes the PNG."""
    shot, png = screenshot
    assert shot.returncode == 0, f"Chromium exited {shot.returncode}: {shot.stderr.strip()[-300:]}"
    assert os.path.exists(png), f"Chromium wrote no {png}"


def test_screenshot_size(image):
    """Chromium took the screenshot at the window's size."""
    assert image.size == SCREEN, f"screenshot size {image.size}, expected {SCREEN}"


def test_not_a_blank_page(image):
    """The screenshot has more than 50 colours."""
    colors = image.getcolors(maxcolors=1 << 24)
    assert len(colors) > 50, f"{len(colors)} colours, expected more than 50: a blank page"


def test_optimal_curve_is_drawn(image):
    """More than 300 pixels of the optimal curve's red (#d62728)."""
    red = count_near(image, (0xd6, 0x27, 0x28))
    assert red > 300, f"{red} pixels of the optimal curve's red, expected more than 300"


def test_per_module_bars_are_drawn(image):
    """More than 2000 pixels of the per-module bars' blue (#92c5de)."""
    blue = count_near(image, (0x92, 0xc5, 0xde))
    assert blue > 2000, f"{blue} pixels of the per-module bars' blue, expected more than 2000"


def test_markdown_has_the_table(ckplan, profile):
    """`--format md` exits 0 with a table that has the optimal row."""
    md = subprocess.run([ckplan, "report", profile, "--format", "md"], capture_output=True, text=True)
    assert md.returncode == 0, f"report --format md exited {md.returncode}: {md.stderr.strip()}"
    assert "| optimal |" in md.stdout and "| --- |" in md.stdout, f"no table with an optimal row in:\n{md.stdout}"


@pytest.fixture(scope="module")
def report_json(ckplan, profile):
    """`ckplan report PROFILE --format json`, parsed."""
    js = subprocess.run([ckplan, "report", profile, "--format", "json"], capture_output=True, text=True)
    assert js.returncode == 0, f"report --format json exited {js.returncode}: {js.stderr.strip()}"
    return json.loads(js.stdout)


def test_json_has_the_strategies(report_json):
    """The JSON form is a ckplan.report/1 with the optimal and none strategies."""
    names = [s["name"] for s in report_json["strategies"]]
    assert report_json["schema"] == "ckplan.report/1", f"schema {report_json['schema']}, expected ckplan.report/1"
    assert "optimal" in names and "none" in names, f"strategies {names}, expected optimal and none among them"


def test_optimal_curve_never_rises(report_json):
    """The optimal curve has more than 20 points and its time never rises as the budget grows."""
    times = [p["time_ms"] for p in report_json["optimal_curve"]]
    assert len(times) > 20, f"{len(times)} points on the optimal curve, expected more than 20"
    rises = [(a, b) for a, b in zip(times, times[1:]) if a < b]
    assert not rises, f"the optimal curve rises: {rises[:5]}"
