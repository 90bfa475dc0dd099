"""No two text labels of the HTML report overlap, and none is clipped by its figure, as headless Chromium
lays them out.

Makes reports where labels crowd: the bundled profile with many close strategies (`--every 2,3,4,5,6,8`)
and a measured run at the optimal plan's own point beside the budget line, and a chain of near-identical
stages with long stage names. A copy of each report gets a script that writes every SVG text element's
rendered box (getBoundingClientRect, transforms included) into the page; `chromium --dump-dom` returns the
page after it ran. The boxes are the browser's, not estimates: a test fails when two boxes of one figure
intersect or a box leaves its figure's viewport. Each report is made and measured once (module-scoped
fixtures); the tests are one per report, figure and check.

    pytest tests/python/report_labels_test.py --ckplan BUILD/ckplan --profile data/example.profile.json
"""
import html
import json
import os
import re
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
EVERY = "2,3,4,5,6,8"

# The report's figures, by their aria-label: each test below is one per report and figure.
FIGURES = {"tradeoff": "Memory / time trade-off",
           "timeline": "Memory over the optimal schedule at the budget",
           "stages": "Activation memory per stage"}

# Writes [{svg, width, height, texts: [{text, left, top, right, bottom}]}]
# into <pre id="ckplan-boxes">, coordinates relative to each SVG's box.
MEASURE = """<script>
(function () {
  var out = [];
  document.querySelectorAll('svg').forEach(function (svg, index) {
    var frame = svg.getBoundingClientRect();
    var texts = [];
    svg.querySelectorAll('text').forEach(function (t) {
      var r = t.getBoundingClientRect();
      texts.push({text: t.textContent, left: r.left - frame.left, top: r.top - frame.top,
                  right: r.right - frame.left, bottom: r.bottom - frame.top});
    });
    out.push({svg: svg.getAttribute('aria-label') || ('svg ' + index), width: frame.width,
              height: frame.height, texts: texts});
  });
  var pre = document.createElement('pre');
  pre.id = 'ckplan-boxes';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""

# Boxes touching within this much (px) do not count as overlapping: glyph
# boxes include the font's line gap, which is blank.
TOLERANCE_PX = 0.5


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return str(tmp_path_factory.mktemp("labels"))


@pytest.fixture(scope="module")
def report_json(ckplan, profile):
    """`ckplan report PROFILE --every ... --format json`: (the finished process, its document or None)."""
    js = subprocess.run([ckplan, "report", profile, "--every", EVERY, "--format", "json"],
                        capture_output=True, text=True)
    return js, (json.loads(js.stdout) if js.returncode == 0 else None)


def test_report_json_exits_0(report_json):
    """`ckplan report --format json` on the profile exits 0."""
    js, _ = report_json
    assert js.returncode == 0, f"report --format json exited {js.returncode}: {js.stderr.strip()}"


def test_report_has_the_crowded_strategies(report_json):
    """With --every 2,3,4,5,6,8 the report has 9 strategies or more, the optimal one among them."""
    _, doc = report_json
    assert doc is not None, "report --format json failed"
    names = [s["name"] for s in doc["strategies"]]
    assert len(names) >= 9, f"{len(names)} strategies in the report ({names}), expected 9 or more"
    assert "optimal" in names, f"no optimal strategy among {names}"


def run_at_optimal(doc):
    """A ckplan.run/1 measured at the optimal plan's predicted point, beside the budget line."""
    optimal = next(s for s in doc["strategies"] if s["name"] == "optimal")
    return {"schema": "ckplan.run/1", "algorithm": "optimal", "budget_bytes": doc["budget_bytes"],
            "measured": {"peak_bytes": optimal["peak_bytes"], "step_ms": optimal["time_ms"]},
            "baseline": {"step_ms": optimal["time_ms"]},
            "predicted": {"peak_bytes": optimal["peak_bytes"], "time_ms": optimal["time_ms"]},
            "verdict": "ok"}


def crowded_chain():
    """Twenty near-identical stages with long module paths: every-n and sqrt
    land within a few percent of each other."""
    stages = []
    for i in range(20):
        stages.append({"name": f"features.denseblock{i // 5 + 1}.denselayer{i % 5 + 1}.conv2.bottleneck_projection_{i}",
                       "fwd_ms": 1.0 + 0.01 * i, "bwd_ms": 2.0, "out_bytes": 1 << 20, "saved_bytes": 3 << 20,
                       "fwd_tmp_bytes": 1 << 19, "bwd_tmp_bytes": 1 << 20})
    return {"schema": "ckplan.chain/1", "input_bytes": 1 << 20, "stages": stages,
            "loss": {"bwd_ms": 0.0, "bwd_tmp_bytes": 0}}


def make_profile_report(profile, work, report_json):
    """The profile's report with many strategies and a run at the optimal plan's point."""
    _, doc = report_json
    assert doc is not None, "report --format json failed: no run to place"
    run_path = os.path.join(work, "run.json")
    with open(run_path, "w") as f:
        json.dump(run_at_optimal(doc), f)
    return ["report", profile, "--every", EVERY, "--runs", run_path]


def make_chain_report(profile, work, report_json):
    """The report of a chain of close stages with long names."""
    chain_path = os.path.join(work, "chain.json")
    with open(chain_path, "w") as f:
        json.dump(crowded_chain(), f)
    return ["report", chain_path, "--every", EVERY]


REPORTS = {"profile": make_profile_report, "chain": make_chain_report}


@pytest.fixture(scope="module", params=list(REPORTS))
def report(request, ckplan, profile, work, report_json):
    """One of REPORTS made: (its name, the finished `ckplan report`, the HTML's path)."""
    name = request.param
    html_path = os.path.join(work, f"{name}.html")
    args = REPORTS[name](profile, work, report_json)
    return name, subprocess.run([ckplan, *args, "-o", html_path], capture_output=True, text=True), html_path


@pytest.fixture(scope="module")
def measured(report, work):
    """The report's SVG text boxes as Chromium lays them out: (the finished Chromium, the figures or None)."""
    name, made, html_path = report
    assert made.returncode == 0, f"{name}: ckplan report exited {made.returncode}: {made.stderr.strip()}"
    with open(html_path) as f:
        page = f.read()
    probe = os.path.join(work, f"{name}.probe.html")
    with open(probe, "w") as f:
        f.write(page.replace("</body>", MEASURE + "</body>"))
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={os.path.join(work, 'chromium')}", "--window-size=1000,2000", "--dump-dom",
               "file://" + probe]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="ckplan-boxes">(.*?)</pre>', result.stdout, re.S)
    return result, (json.loads(html.unescape(match.group(1))) if match else None)


def test_report_exits_0(report):
    """`ckplan report ... -o HTML` exits 0 and writes the page."""
    name, made, html_path = report
    assert made.returncode == 0, f"{name}: ckplan report exited {made.returncode}: {made.stderr.strip()}"
    assert os.path.getsize(html_path) > 0, f"{name}: ckplan report wrote an empty page"


def test_chromium_measures_the_labels(report, measured):
    """Chromium exits 0 and the page it dumps holds the boxes the script wrote."""
    name = report[0]
    result, figures = measured
    assert result.returncode == 0, f"{name}: Chromium exited {result.returncode}: {result.stderr.strip()[-300:]}"
    assert figures is not None, f"{name}: no measured boxes in the page Chromium dumped"


def test_three_figures(report, measured):
    """The report has three figures, the three of FIGURES."""
    name = report[0]
    _, figures = measured
    labels = [f["svg"] for f in figures or []]
    assert sorted(labels) == sorted(FIGURES.values()), f"{name}: figures {labels}, expected {list(FIGURES.values())}"


def texts_of(report, measured, figure):
    """The non-blank text boxes of the figure named `figure` in FIGURES, and the figure; fails when the
    report has no such figure."""
    name = report[0]
    _, figures = measured
    assert figures is not None, f"{name}: Chromium measured nothing"
    found = [f for f in figures if f["svg"] == FIGURES[figure]]
    assert len(found) == 1, f"{name}: {len(found)} figures labelled '{FIGURES[figure]}', expected 1"
    return [t for t in found[0]["texts"] if t["text"].strip()], found[0]


@pytest.mark.parametrize("figure", list(FIGURES))
def test_figure_has_labels(report, measured, figure):
    """The figure has more than 5 text labels (what the next two tests check is there)."""
    texts, _ = texts_of(report, measured, figure)
    assert len(texts) > 5, f"{report[0]} / {FIGURES[figure]}: {len(texts)} labels, expected more than 5"


def overlap(a, b):
    return (min(a["right"], b["right"]) - max(a["left"], b["left"]) > TOLERANCE_PX and
            min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > TOLERANCE_PX)


@pytest.mark.parametrize("figure", list(FIGURES))
def test_no_two_labels_overlap(report, measured, figure):
    """No two text boxes of the figure intersect by more than TOLERANCE_PX both ways."""
    texts, _ = texts_of(report, measured, figure)
    assert texts, f"{report[0]} / {FIGURES[figure]}: no labels measured"
    clashes = [(a["text"], b["text"]) for i, a in enumerate(texts) for b in texts[i + 1:] if overlap(a, b)]
    assert not clashes, f"{report[0]} / {FIGURES[figure]}: {len(clashes)} pairs of labels overlap: {clashes[:6]}"


@pytest.mark.parametrize("figure", list(FIGURES))
def test_no_label_clipped(report, measured, figure):
    """No text box of the figure leaves its viewport by more than TOLERANCE_PX."""
    texts, box = texts_of(report, measured, figure)
    assert texts, f"{report[0]} / {FIGURES[figure]}: no labels measured"
    clipped = [t["text"] for t in texts
               if t["left"] < -TOLERANCE_PX or t["top"] < -TOLERANCE_PX or
               t["right"] > box["width"] + TOLERANCE_PX or t["bottom"] > box["height"] + TOLERANCE_PX]
    assert not clipped, f"{report[0]} / {FIGURES[figure]}: labels clipped by the figure " \
                        f"({box['width']}x{box['height']} px): {clipped[:6]}"
