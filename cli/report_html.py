"""A self-contained HTML report: a summary of what failed at the top (by how much, on what
input, how to replay it), then a table with an error histogram per check, then each failure
in full with heatmaps of the attention weights of its counterexample.
Inline SVG only: no scripts, no external files."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from mha_verify.properties.engine.results import CheckResult
from mha_verify.report_groups import as_float, group_failures, not_finite
from mha_verify.report_text import hypothesis_hint

_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "error": "#4e342e", "warn": "#ef6c00", "declared": "#6a1b9a",
            "finding": "#1565c0", "n/a": "#757575"}
# histogram bins: exactly 0, (0, 1e-5), [1e-5, 1e-4), ..., [1e-1, 1], then over 1, inf or NaN (a failure)
_BINS = ["0", "<1e-5", "1e-5", "1e-4", "1e-3", "1e-2", "1e-1", ">1"]
_FAIL_BIN = len(_BINS) - 1


def _bin(ratio: object) -> int:
    """The histogram bin of one error / allowed ratio: a float, or a string after JSON ("inf", "nan")."""
    r = as_float(ratio)
    if r is None or not r <= 1:  # over the tolerance, inf, NaN or unreadable: the red bin
        return _FAIL_BIN
    if r <= 0:
        return 0
    return min(6, max(1, 7 + math.floor(math.log10(r))))


def _histogram(ratios: Sequence[object], width: int = 264, height: int = 64) -> str:
    """Histogram of error / allowed on a log scale from 1e-5 to >1 (the tolerance is at 1)."""
    if not ratios:
        return "<span class=muted>no measured errors</span>"
    counts = [0] * len(_BINS)
    for r in ratios:
        counts[_bin(r)] += 1
    top = max(counts)
    bw = width / len(counts)
    bars = []
    for i, c in enumerate(counts):
        h = (height - 24) * c / top
        colour = "#c62828" if i == _FAIL_BIN else "#1565c0"
        x = i * bw + bw / 2
        bars.append(f'<rect x="{i * bw + 1:.1f}" y="{height - 13 - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
                    f'fill="{colour}"><title>{_BINS[i]}: {c}</title></rect>'
                    f'<text x="{x:.1f}" y="{height - 2}" font-size="9" text-anchor="middle">{_BINS[i]}</text>')
        if c:
            bars.append(f'<text x="{x:.1f}" y="{height - 16 - h:.1f}" font-size="9" text-anchor="middle" '
                        f'fill="{colour}">{c}</text>')
    label = 'role="img" aria-label="error/allowed histogram"'
    return f'<svg class=hist width="{width}" height="{height}" {label}>{"".join(bars)}</svg>'


def _ratios(r: CheckResult) -> list[object]:
    """The per-example ratios, plus the failing example's when the runner did not record it."""
    ratios: list[object] = list(r.details.get("error_ratios", []))
    if r.failed and not any(_bin(x) == _FAIL_BIN for x in ratios):
        error, allowed = as_float(r.worst_error), as_float(r.allowed)
        if error is not None:
            ratios.append(error / allowed if allowed else (0.0 if error == 0 else math.inf))
        elif not ratios:
            ratios.append(math.inf)  # failed without a measure (an exception): still a failed example
    return ratios


def _heatmap(weights: list[list[list[float]]], size: int = 180) -> str:
    """One grid per head: rows are queries, columns keys; white = 0, dark blue = 1, magenta = NaN."""
    parts = []
    for h, head in enumerate(weights):
        rows, cols = len(head), len(head[0]) if head else 0
        cell = max(3, min(24, size // max(rows, cols, 1)))
        cells = []
        for i, row in enumerate(head):
            for j, raw in enumerate(row):
                w = as_float(raw)
                w = math.nan if w is None else w
                value = 0.0 if math.isnan(w) else max(0.0, min(1.0, w))
                shade = int(255 - 200 * value)
                fill = "#ff00ff" if math.isnan(w) else f"rgb({shade},{shade},255)"
                cells.append(f'<rect x="{j * cell}" y="{i * cell}" width="{cell}" height="{cell}" fill="{fill}" '
                             f'stroke="#ccc"><title>q{i} k{j}: {w:.4g}</title></rect>')
        parts.append(f'<figure><svg class=heatmap width="{cols * cell}" height="{rows * cell}" role="img" '
                     f'aria-label="attention weights, head {h}">{"".join(cells)}</svg>'
                     f"<figcaption>head {h}</figcaption></figure>")
    return "".join(parts)


def _num(value: object) -> str:
    x = as_float(value)
    return "-" if x is None else f"{x:.3g}"


def _by_how_much(r: CheckResult) -> str:
    """'NaN' for a non-finite output, else the error against the allowed error and their ratio."""
    error, allowed = as_float(r.worst_error), as_float(r.allowed)
    if not_finite(r):
        return f"NaN &mdash; the output is not finite (error {_num(error)}, allowed {_num(allowed)})"
    if error is None:
        return "no measure (the check raised)"
    if not allowed:
        return f"error {error:.3g}, allowed 0"
    return f"error {error:.3g} vs allowed {allowed:.3g} ({error / allowed:.3g}&times; the tolerance)"


def _summary(results: Sequence[CheckResult]) -> str:
    e = html.escape
    groups = group_failures(results)
    found = _findings(results)
    if not groups:
        n = sum(r.verdict != "n/a" for r in results)
        return f'<section id=summary class="box ok"><h2>All {n} applicable checks held.</h2>{found}</section>'
    items = []
    for r, same in groups:
        rows = [f"<tr><th>by how much</th><td class=amount>{_by_how_much(r)}</td></tr>",
                f"<tr><th>what</th><td>{e(r.reason or '')}</td></tr>"]
        if r.counterexample:
            rows.append(f"<tr><th>input</th><td><code class=counterexample>{e(r.counterexample)}</code></td></tr>")
        if r.replay:
            rows.append(f"<tr><th>replay</th><td><code class=replay>{e(r.replay)}</code></td></tr>")
        if same:
            names = ", ".join(f"<b>{e(s.name if s.stage == r.stage else f'{s.stage}/{s.name}')}</b>" for s in same)
            rows.append(f"<tr><th>same cause</th><td>{names}: also a NaN or inf output, "
                        f"same cause as {e(r.name)} (each in full below)</td></tr>")
        items.append(f'<div class=failure><h3><span class=x>FAIL</span> {e(r.stage)}/{e(r.name)}</h3>'
                     f"<table class=facts>{''.join(rows)}</table></div>")
    return f"<section id=summary class=\"box bad\">{''.join(items)}{found}</section>"


def _findings(results: Sequence[CheckResult]) -> str:
    """The findings that are not failures, each with its kind, said once."""
    e = html.escape
    seen: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r.kind_label and r.reason:
            seen.setdefault((r.kind_label, r.reason), []).append(r.name)
    if not seen:
        return ""
    items = "".join(f"<li><b>{e(label)}</b> ({e(', '.join(names))}): {e(reason)}</li>"
                    for (label, reason), names in seen.items())
    return f"<h3>Findings that are not failures</h3><ul class=findings>{items}</ul>"


def _details(results: Sequence[CheckResult]) -> str:
    e = html.escape
    blocks = []
    for r in results:
        if not r.failed:
            continue
        block = [f'<div class=detail id="fail-{e(r.stage)}-{e(r.name)}"><h3>{e(r.stage)}/{e(r.name)}</h3>',
                 f"<p>{e(r.reason or '')}</p>"]
        if r.counterexample:
            block.append(f"<p><b>counterexample</b>: <code>{e(r.counterexample)}</code></p>")
        if r.replay:
            block.append(f"<p><b>replay</b>: <code>{e(r.replay)}</code></p>")
        for note in r.details.get("hypothesis", []):
            block.append(f"<pre>{e(hypothesis_hint(str(note)))}</pre>")
        hm = r.details.get("heatmap")
        if hm:
            block.append(f"<p>attention weights of item 0 ({e(str(hm['source']))}); white 0, blue 1, magenta NaN</p>"
                         f'<div class=maps>{_heatmap(hm["weights"])}</div>')
        blocks.append("".join(block) + "</div>")
    return "".join(blocks) or "<p>none</p>"


def document(results: Sequence[CheckResult], *, target: str, profile: str, versions: dict[str, str]) -> str:
    e = html.escape
    rows = []
    for r in results:
        rows.append(
            f'<tr><td>{e(r.stage)}</td><td>{e(r.name)}</td><td class=num>{r.examples}</td>'
            f'<td style="color:{_COLOURS[r.verdict]};font-weight:bold">{e(r.verdict)}'
            f'{"<br><small>" + e(r.kind_label) + "</small>" if r.kind_label else ""}</td>'
            f'<td class=num>{_num(r.worst_error)}</td><td class=num>{_num(r.allowed)}</td>'
            f'<td>{_histogram(_ratios(r))}</td><td class=note>{e(r.reason or "")}</td></tr>'
        )
    vers = ", ".join(f"{e(k)} {e(v)}" for k, v in versions.items())
    failed = sum(r.failed for r in results)
    errored = sum(r.errored for r in results)
    verdict = f"FAIL: {failed} of {len(results)} checks failed" if failed else \
        f"NO VERDICT: {errored} of {len(results)} checks raised in mha-verify" if errored else \
        f"PASS: {len(results)} checks"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mha-verify {e(verdict)}: {e(target)}</title>
<style>body{{font-family:sans-serif;margin:1em 2em;color:#222}}h1{{margin:.2em 0}}
h1.bad{{color:#c62828}}h1.ok{{color:#2e7d32}}.meta{{color:#555;margin:.2em 0 .8em}}
.box{{border:2px solid;border-radius:6px;padding:.3em 1em;margin-bottom:1em}}
.box.bad{{border-color:#c62828;background:#fff5f5}}.box.ok{{border-color:#2e7d32;background:#f3fbf3}}
.failure h3{{margin:.4em 0}}.x{{background:#c62828;color:#fff;padding:0 .3em;border-radius:3px}}
.facts th{{text-align:left;vertical-align:top;padding:2px 1em 2px 0;white-space:nowrap;color:#555}}
.facts td{{padding:2px 0}}.facts code{{font-size:12px}}.amount{{font-weight:bold;color:#c62828}}
code{{background:#eee;padding:1px 3px}}
table.checks{{border-collapse:collapse}}
.checks td,.checks th{{border-bottom:1px solid #ddd;padding:3px 8px;vertical-align:middle;text-align:left}}
.num{{font-variant-numeric:tabular-nums;white-space:nowrap}}.note{{max-width:28em;font-size:90%}}
.muted{{color:#999}}.vers{{font-size:75%}}.maps{{display:flex;flex-wrap:wrap;gap:1em}}figure{{margin:0}}</style></head>
<body><h1 class="{"bad" if failed or errored else "ok"}">mha-verify {e(verdict)}</h1>
<p class=meta>target <code>{e(target)}</code>, profile {e(profile)} <span class=vers>({vers})</span></p>
{_summary(results)}
<section id=checks><h2>Checks</h2>
<p class=meta>Histograms: each example's error divided by its allowed error (the tolerance is 1; red = over, inf
or NaN).</p>
<table class=checks><tr><th>stage</th><th>check</th><th>examples</th><th>verdict</th><th>worst error</th>
<th>allowed</th><th>error / allowed</th><th>note</th></tr>{"".join(rows)}</table></section>
<section id=failures><h2>Failures in full</h2>{_details(results)}</section>
</body></html>
"""
