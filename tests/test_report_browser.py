"""The HTML report of a failing run, rendered in headless Chromium at 1280x900: what a person
checks first is on the first screen (what failed, by how much, on what input, how to replay it),
and the histograms and heatmaps are drawn.

Runs under ``tox -e browser`` (``pytest -m browser``); skipped with the reason when no Chromium
is on PATH (Debian: ``apt-get install chromium``). ``MHA_VERIFY_SCREENSHOT=docs/report.png``
also copies the screenshot there (that is how docs/report.png is made).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 1280, 900
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,  # a real Chromium process
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)"),
]

# Appended to a copy of the report (the report itself has no script): measures the layout the
# browser computed and writes it into the DOM, which --dump-dom then prints.
PROBE = """<script>
const boxes = sel => [...document.querySelectorAll(sel)].map(el => {
  const b = el.getBoundingClientRect(), cs = getComputedStyle(el);
  return {top: b.top, bottom: b.bottom, right: b.right, width: b.width, height: b.height,
          shown: cs.display !== "none" && cs.visibility !== "hidden", text: el.textContent.slice(0, 3000),
          red: [...el.querySelectorAll('rect[fill="#c62828"]')].filter(r => r.getBBox().height > 0).length};
});
const layout = {viewport: [innerWidth, innerHeight], summary: boxes("#summary"), title: boxes("#summary h3"),
  amount: boxes("#summary .amount"), input: boxes("#summary .counterexample"), replay: boxes("#summary .replay"),
  checks: boxes("#checks"), failures: boxes("#failures"), hist: boxes("svg.hist"), heatmap: boxes("svg.heatmap")};
const pre = document.createElement("pre");
pre.id = "layout";
pre.textContent = JSON.stringify(layout);
document.body.appendChild(pre);
</script>"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--window-size={WIDTH},{HEIGHT}"]
    proc = subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    return width, height


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML report of a real run of the CLI against seed 000 (NaN on fully masked rows)."""
    page = tmp_path_factory.mktemp("report") / "report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "mha_verify.cli", "check", "--no-export", "--target",
         "tests/fixtures/seed_000.py:MultiHeadAttention", "--profile", "quick", "--seed", "0",
         "--only", "fully_masked_rows,oracle_agreement,rows_sum_to_one", "--html", str(page)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 1, proc.stderr  # seed 000 fails
    return page


def test_the_first_screen_says_what_failed_by_how_much_on_what_input_and_how_to_replay(
        failing_report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", failing_report.as_uri())
    assert _png_size(shot) == (WIDTH, HEIGHT)
    if os.environ.get("MHA_VERIFY_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["MHA_VERIFY_SCREENSHOT"])

    probed = tmp_path / "probed.html"
    probed.write_text(failing_report.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", probed.as_uri()).stdout
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom, re.DOTALL)
    assert found, f"the probe did not run; DOM starts: {dom[:500]}"
    layout = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                        .replace("&gt;", ">"))
    width, height = layout["viewport"]
    assert width <= WIDTH and height <= HEIGHT, layout["viewport"]

    # what failed, by how much, on what input, how to replay: inside the first screen
    first_screen = {key: layout[key][0] for key in ("summary", "title", "amount", "input", "replay")}
    for key, box in first_screen.items():
        assert box["shown"] and box["height"] > 0, f"#summary {key} is not drawn: {box}"
        assert box["bottom"] <= height and box["right"] <= width, f"#summary {key} is below the fold: {box}"
    assert "fully_masked_rows" in first_screen["title"]["text"]
    assert "NaN" in first_screen["amount"]["text"]
    assert re.search(r"B=\d+ Lq=\d+ Lk=\d+ .*mask", first_screen["input"]["text"]), first_screen["input"]
    assert "mha-verify check" in first_screen["replay"]["text"] and "--only fully_masked_rows" in \
        first_screen["replay"]["text"]
    # one root cause: oracle_agreement's NaN is listed under fully_masked_rows, not in full
    assert len(layout["title"]) == 1, [t["text"] for t in layout["title"]]
    assert "oracle_agreement" in layout["summary"][0]["text"] and "same cause" in layout["summary"][0]["text"]
    # summary, then the table, then the failures in full
    assert layout["summary"][0]["bottom"] <= layout["checks"][0]["top"] <= layout["failures"][0]["top"]

    # histograms and heatmaps are drawn; a failed check's histogram shows its failure in red
    assert len(layout["hist"]) >= 2 and len(layout["heatmap"]) >= 1
    for box in layout["hist"] + layout["heatmap"]:
        assert box["shown"] and box["width"] > 0 and box["height"] > 0, box
    assert all(box["red"] >= 1 for box in layout["hist"]), [b["red"] for b in layout["hist"]]
