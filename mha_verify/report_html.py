"""A self-contained HTML report: a table, an error histogram per check, and heatmaps of the
attention weights of each counterexample. Inline SVG only: no scripts, no external files."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from properties.results import CheckResult

_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "warn": "#ef6c00", "declared": "#6a1b9a", "n/a": "#757575"}


def _histogram(ratios: Sequence[float | str], width: int = 220, height: int = 60) -> str:
    """Histogram of error / allowed on a log scale from 1e-6 to >1 (the tolerance is at 1)."""
    if not ratios:
        return "<span class=muted>no measured errors</span>"
    # buckets: exactly 0, (0, 1e-5), [1e-5, 1e-4), ..., [1e-1, 1], above 1 (a failure)
    labels = ["0", "<1e-5", "1e-5", "1e-4", "1e-3", "1e-2", "1e-1", ">1"]
    counts = [0] * len(labels)
    for raw in ratios:
        r = float(raw)  # "inf"/"nan" (JSON has neither) land in the red bin
        if math.isnan(r):
            r = math.inf
        if r == 0:
            counts[0] += 1
        elif r > 1:
            counts[-1] += 1
        else:
            counts[min(6, max(1, 7 + math.floor(math.log10(r))))] += 1
    top = max(counts) or 1
    bw = width / len(counts)
    bars = []
    for i, c in enumerate(counts):
        h = (height - 14) * c / top
        colour = "#c62828" if i == len(counts) - 1 else "#1565c0"
        bars.append(f'<rect x="{i * bw + 1:.1f}" y="{height - 12 - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
                    f'fill="{colour}"><title>{labels[i]}: {c}</title></rect>'
                    f'<text x="{i * bw + bw / 2:.1f}" y="{height - 2}" font-size="7" text-anchor="middle">'
                    f'{labels[i]}</text>')
    label = 'role="img" aria-label="error/allowed histogram"'
    return f'<svg width="{width}" height="{height}" {label}>{"".join(bars)}</svg>'


def _heatmap(weights: list[list[list[float]]], cell: int = 18) -> str:
    """One grid per head: rows are queries, columns keys; white = 0, dark blue = 1."""
    parts = []
    for h, head in enumerate(weights):
        rows, cols = len(head), len(head[0]) if head else 0
        cells = []
        for i, row in enumerate(head):
            for j, w in enumerate(row):
                value = 0.0 if math.isnan(w) else max(0.0, min(1.0, w))
                shade = int(255 - 200 * value)
                fill = "#ff00ff" if math.isnan(w) else f"rgb({shade},{shade},255)"
                cells.append(f'<rect x="{j * cell}" y="{i * cell}" width="{cell}" height="{cell}" fill="{fill}" '
                             f'stroke="#ccc"><title>q{i} k{j}: {w:.4g}</title></rect>')
        parts.append(f'<figure><svg width="{cols * cell}" height="{rows * cell}">{"".join(cells)}</svg>'
                     f"<figcaption>head {h}</figcaption></figure>")
    return "".join(parts)


def document(results: Sequence[CheckResult], *, target: str, profile: str, versions: dict[str, str]) -> str:
    e = html.escape
    rows = []
    for r in results:
        err = "-" if r.worst_error is None else f"{r.worst_error:.3g}"
        tol = "-" if r.allowed is None else f"{r.allowed:.3g}"
        rows.append(
            f'<tr><td>{e(r.stage)}</td><td>{e(r.name)}</td><td>{r.examples}</td>'
            f'<td style="color:{_COLOURS[r.verdict]};font-weight:bold">{e(r.verdict)}</td><td>{err}</td><td>{tol}</td>'
            f'<td>{_histogram(r.details.get("error_ratios", []))}</td><td>{e(r.reason or "")}</td></tr>'
        )
    failures = []
    for r in results:
        if not r.failed:
            continue
        block = [f"<h3>{e(r.stage)}/{e(r.name)}</h3>", f"<p>{e(r.reason or '')}</p>"]
        if r.counterexample:
            block.append(f"<p><b>counterexample</b>: <code>{e(r.counterexample)}</code></p>")
        if r.replay:
            block.append(f"<p><b>replay</b>: <code>{e(r.replay)}</code></p>")
        hm = r.details.get("heatmap")
        if hm:
            block.append(f"<p>attention weights of item 0 ({e(str(hm['source']))}); magenta = NaN</p>"
                         f'<div class=maps>{_heatmap(hm["weights"])}</div>')
        failures.append("".join(block))
    vers = ", ".join(f"{e(k)} {e(v)}" for k, v in versions.items())
    verdict = "FAIL" if any(r.failed for r in results) else "PASS"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mha-verify: {e(target)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border-bottom:1px solid #ddd;padding:4px 8px;vertical-align:middle;text-align:left}}
.muted{{color:#999}}.maps{{display:flex;flex-wrap:wrap;gap:1em}}figure{{margin:0}}</style></head>
<body><h1>mha-verify: {verdict}</h1>
<p>target <code>{e(target)}</code>, profile {e(profile)}; {vers}</p>
<p>Histograms show each example's error divided by its allowed error (the tolerance is 1; red = over).</p>
<table><tr><th>stage</th><th>check</th><th>examples</th><th>verdict</th><th>worst error</th><th>allowed</th>
<th>error / allowed</th><th>note</th></tr>{"".join(rows)}</table>
<h2>Failures</h2>{"".join(failures) or "<p>none</p>"}
</body></html>
"""
