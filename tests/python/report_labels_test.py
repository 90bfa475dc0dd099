#!/usr/bin/env python3
"""No two text labels of the HTML report overlap, and none is clipped by its
figure, as headless Chromium lays them out.

Makes reports where labels crowd: the bundled profile with many close
strategies (`--every 2,3,4,5,6,8`) and a measured run at the optimal plan's
own point beside the budget line, and a chain of near-identical stages with
long stage names. A copy of each report gets a script that writes every SVG
text element's rendered box (getBoundingClientRect, transforms included) into
the page; `chromium --dump-dom` returns the page after it ran. The boxes are
the browser's, not estimates: a check fails when two boxes of one figure
intersect or a box leaves its figure's viewport.

    tests/python/report_labels_test.py --ckplan BUILD/ckplan --profile data/example.profile.json [--chromium PATH]
"""
import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from checks import check, finish

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


def measure(chromium, html_path, work):
    with open(html_path) as f:
        page = f.read()
    probe = os.path.join(work, "probe.html")
    with open(probe, "w") as f:
        f.write(page.replace("</body>", MEASURE + "</body>"))
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={os.path.join(work, 'chromium')}", "--window-size=1000,2000", "--dump-dom",
               "file://" + probe]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="ckplan-boxes">(.*?)</pre>', result.stdout, re.S)
    check(result.returncode == 0 and match is not None, f"Chromium measured the labels of {os.path.basename(html_path)}")
    return json.loads(html.unescape(match.group(1))) if match else []


def overlap(a, b):
    return (min(a["right"], b["right"]) - max(a["left"], b["left"]) > TOLERANCE_PX and
            min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > TOLERANCE_PX)


def check_labels(figures, name):
    check(len(figures) == 3, f"{name}: three figures measured")
    for figure in figures:
        texts = [t for t in figure["texts"] if t["text"].strip()]
        check(len(texts) > 5, f"{name} / {figure['svg']}: {len(texts)} labels")
        clashes = [(a["text"], b["text"]) for i, a in enumerate(texts) for b in texts[i + 1:] if overlap(a, b)]
        check(not clashes, f"{name} / {figure['svg']}: no two labels overlap (overlapping: {clashes[:6]})")
        clipped = [t["text"] for t in texts
                   if t["left"] < -TOLERANCE_PX or t["top"] < -TOLERANCE_PX or
                   t["right"] > figure["width"] + TOLERANCE_PX or t["bottom"] > figure["height"] + TOLERANCE_PX]
        check(not clipped, f"{name} / {figure['svg']}: no label clipped by the figure (clipped: {clipped[:6]})")


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


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckplan", required=True)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        # A run measured at the optimal plan's predicted point, beside the budget line.
        js = subprocess.run([args.ckplan, "report", args.profile, "--every", "2,3,4,5,6,8", "--format", "json"],
                            capture_output=True, text=True)
        check(js.returncode == 0, f"report --format json exits 0 ({js.stderr.strip()})")
        doc = json.loads(js.stdout) if js.returncode == 0 else {"strategies": [], "budget_bytes": 0}
        optimal = [s for s in doc["strategies"] if s["name"] == "optimal"]
        check(len(doc["strategies"]) >= 9, f"{len(doc['strategies'])} strategies in the report")
        run_path = os.path.join(work, "run.json")
        if optimal:
            run = {"schema": "ckplan.run/1", "algorithm": "optimal", "budget_bytes": doc["budget_bytes"],
                   "measured": {"peak_bytes": optimal[0]["peak_bytes"], "step_ms": optimal[0]["time_ms"]},
                   "baseline": {"step_ms": optimal[0]["time_ms"]},
                   "predicted": {"peak_bytes": optimal[0]["peak_bytes"], "time_ms": optimal[0]["time_ms"]},
                   "verdict": "ok"}
            with open(run_path, "w") as f:
                json.dump(run, f)

        cases = []
        profile_html = os.path.join(work, "profile.html")
        r = subprocess.run([args.ckplan, "report", args.profile, "--every", "2,3,4,5,6,8", "--runs", run_path,
                            "-o", profile_html], capture_output=True, text=True)
        check(r.returncode == 0, f"report on the profile exits 0 ({r.stderr.strip()})")
        cases.append(("profile, many strategies and a run", profile_html))

        chain_path = os.path.join(work, "chain.json")
        with open(chain_path, "w") as f:
            json.dump(crowded_chain(), f)
        chain_html = os.path.join(work, "chain.html")
        r = subprocess.run([args.ckplan, "report", chain_path, "--every", "2,3,4,5,6,8", "-o", chain_html],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"report on the crowded chain exits 0 ({r.stderr.strip()})")
        cases.append(("chain of close stages, long names", chain_html))

        for name, path in cases:
            if os.path.exists(path):
                figures = measure(args.chromium, path, work)
                for figure in figures:
                    print(f"{name} / {figure['svg']}: {len(figure['texts'])} text elements")
                check_labels(figures, name)
    return finish()


def test_report_labels(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan", "--profile") == 0


if __name__ == "__main__":
    sys.exit(main())
