"""The sweep's truth table in Markdown: totals, failure causes across classes, one row per class."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from urllib.parse import quote

from mha_verify.escape import printable
from mha_verify.sweep_rows import KIND_ORDER, Row, cause_of


def _cell(text: str, limit: int = 240) -> str:
    """Text safe in one Markdown table cell: one line, pipes escaped, control characters shown."""
    one = " ".join(printable(text).split())
    one = one if len(one) <= limit else one[: limit - 1] + "…"
    return one.replace("|", "\\|")


def _verdicts(row: Row) -> str:
    if not row.counts:
        return ""
    c = row.counts
    more = "".join(f", {c[key]} {word}" for key, word in (("warn", "warned"), ("declared", "declared"),
                                                        ("finding", "finding" if c.get("finding") == 1 else "findings"))
                   if c.get(key))
    return f"{c.get('pass', 0)} passed, {c.get('fail', 0)} failed, {c.get('n/a', 0)} n/a{more}"


def _what(row: Row) -> str:
    parts = [f"{', '.join(checks)}: {cause}" for cause, checks in row.causes.items()]
    parts += [f"{', '.join(checks)}: {finding}" for finding, checks in row.findings.items()]
    return "; ".join(parts) if parts else row.reason or row.built_as


def _bundles(row: Row) -> str:
    """Links to the row's reproduction bundles (each folder's replay.py), or ""."""
    links = [f"[{Path(b).parent.name}]({quote(b)})" for b in row.bundles]
    return " bundles: " + ", ".join(links) if links else ""


def _generic(row: Row) -> str:
    """A row's reason with its own class named <class> and numbers masked, so that one reason
    groups the classes it stops."""
    module, _, name = row.spec.rpartition(":")
    text = row.reason.replace(row.spec, "<class>").replace(f"{name}.", "<class>.").replace(name, "<class>")
    return cause_of(text.replace(module, "<module>"))


def markdown(rows: list[Row], totals: dict[str, int], context: dict[str, str], command: str) -> str:
    lines = [
        f"# Sweep of {context['library']} {context['library_version']}",
        "",
        f"mha-verify {context['mha_verify']}, torch {context['torch']}, profile {context['profile']}: `{command}`",
        "",
        "| " + " | ".join(totals) + " |",
        "|" + "---|" * len(totals),
        "| " + " | ".join(str(v) for v in totals.values()) + " |",
        "",
    ]
    causes: Counter[str] = Counter()
    for row in rows:
        for cause in row.causes:
            causes[cause] += 1
    if causes:
        lines += ["## Failure causes (classes)", "", "| classes | cause |", "|---|---|"]
        lines += [f"| {n} | {_cell(cause)} |" for cause, n in causes.most_common()]
        lines.append("")
    found: Counter[str] = Counter()
    for row in rows:
        for finding in row.findings:
            found[finding] += 1
    if found:
        lines += ["## Findings that are not failures, by kind (classes)", "",
                  "| classes | kind: what | checks |", "|---|---|---|"]
        checks = {f: sorted({c for row in rows for c in row.findings.get(f, [])}) for f in found}
        lines += [f"| {n} | {_cell(f)} | {_cell(', '.join(checks[f]), 120)} |" for f, n in found.most_common()]
        lines.append("")
    reasons = Counter(_cell(_generic(r), 160) for r in rows if r.status == "not built")
    if reasons:
        lines += ["## Why classes were not built (classes)", "", "| classes | reason |", "|---|---|"]
        lines += [f"| {n} | {reason} |" for reason, n in reasons.most_common()]
        lines.append("")
    lines += ["## Classes, by verdict kind", "",
              "| class | verdict kind | verdicts | built as, failures, findings or reason | seconds |",
              "|---|---|---|---|---|"]
    order = {k: i for i, k in enumerate(("FAIL", *KIND_ORDER, "passed"))}
    for row in sorted(rows, key=lambda r: order.get(r.verdict_kind, len(order))):  # stable: file order within
        seconds = row.build_seconds + row.check_seconds
        lines.append(f"| `{_cell(row.spec.rpartition(':')[2] + ' (' + row.spec.rpartition(':')[0] + ')')}` | "
                     f"{row.verdict_kind} | {_verdicts(row)} | {_cell(_what(row))}{_bundles(row)} | {seconds:.0f} |")
    return "\n".join(lines) + "\n"
