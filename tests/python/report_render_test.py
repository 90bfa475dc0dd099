#!/usr/bin/env python3
"""The HTML report renders in a real browser: headless Chromium takes a
screenshot of `ckplan report` on the bundled profile, and the page must show
its figures (the optimal curve's red, the per-module bars' blue), its table
text and no blank page. Also checks the Markdown and JSON forms.

    tests/python/report_render_test.py --ckplan BUILD/ckplan --profile data/example.profile.json [--chromium PATH]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from PIL import Image

from checks import check, finish

def count_near(image, rgb, tolerance=40):
    r0, g0, b0 = rgb
    return sum(1 for (r, g, b) in image.getdata()
               if abs(r - r0) <= tolerance and abs(g - g0) <= tolerance and abs(b - b0) <= tolerance)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckplan", required=True)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        html = os.path.join(work, "report.html")
        result = subprocess.run([args.ckplan, "report", args.profile, "-o", html], capture_output=True, text=True)
        check(result.returncode == 0, f"ckplan report exits 0 ({result.stderr.strip()})")
        text = open(html).read()
        check(text.count("<svg") == 3, "three inline SVG figures")
        check("<script" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", ""),
              "self-contained: no script, no network")
        for label in ("peak memory of the step (MiB)", "step time (ms)", "memory (MiB)"):
            check(label in text, f"axis labelled '{label}'")

        png = os.path.join(work, "report.png")
        command = [args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   f"--user-data-dir={os.path.join(work, 'profile')}", "--window-size=900,2000",
                   f"--screenshot={png}", "file://" + html]
        shot = subprocess.run(command, capture_output=True, text=True, timeout=120)
        check(shot.returncode == 0 and os.path.exists(png), "Chromium took a screenshot")
        if os.path.exists(png):
            image = Image.open(png).convert("RGB")
            check(image.size == (900, 2000), f"screenshot size {image.size}")
            colors = image.getcolors(maxcolors=1 << 20) or []
            check(len(colors) > 50, f"not a blank page ({len(colors)} colors)")
            red = count_near(image, (0xd6, 0x27, 0x28))
            blue = count_near(image, (0x92, 0xc5, 0xde))
            print(f"curve pixels {red}, bar pixels {blue}")
            check(red > 300, "the optimal curve is drawn")
            check(blue > 2000, "the per-module bars are drawn")

        md = subprocess.run([args.ckplan, "report", args.profile, "--format", "md"], capture_output=True, text=True)
        check(md.returncode == 0 and "| optimal |" in md.stdout and "| --- |" in md.stdout, "Markdown has the table")
        js = subprocess.run([args.ckplan, "report", args.profile, "--format", "json"], capture_output=True, text=True)
        doc = json.loads(js.stdout)
        names = [s["name"] for s in doc["strategies"]]
        check(doc["schema"] == "ckplan.report/1" and "optimal" in names and "none" in names, "JSON has the strategies")
        times = [p["time_ms"] for p in doc["optimal_curve"]]
        check(len(times) > 20 and all(a >= b for a, b in zip(times, times[1:])), "the optimal curve never rises")
    return finish()


def test_report_render(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan", "--profile") == 0


if __name__ == "__main__":
    sys.exit(main())
