"""Format CheckResults for a person: a table per stage, then each failure in full."""

from __future__ import annotations

import re
from collections.abc import Iterable

from mha_verify.properties.engine.results import KINDS, VERDICTS, CheckResult
from mha_verify.report_groups import group_failures

_MARK = {"pass": "ok", "fail": "FAIL", "error": "ERROR", "warn": "warn", "declared": "declared", "finding": "finding",
         "n/a": "n/a"}


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def table(results: Iterable[CheckResult], title: str | None = None) -> str:
    """One table per stage: check, examples, verdict, worst error against its tolerance, seconds. Each
    is headed by its stage, or by ``title`` (what the command did: ``validate`` runs export-stage checks)."""
    rows = list(results)
    lines: list[str] = []
    for stage in dict.fromkeys(r.stage for r in rows):
        stage_rows = [r for r in rows if r.stage == stage]
        width = max(len("check"), *(len(r.name) for r in stage_rows))
        lines.append(f"\n{title or stage}")
        head = f"  {'check':<{width}}  {'examples':>8}  {'verdict':<8}  {'worst error':>11}  {'allowed':>9}"
        lines.append(f"{head}  {'s':>6}")
        for r in stage_rows:
            lines.append(
                f"  {r.name:<{width}}  {r.examples:>8}  {_MARK[r.verdict]:<8}  {_num(r.worst_error):>11}  "
                f"{_num(r.allowed):>9}  {r.seconds:>6.1f}"
            )
            if r.kind is not None:  # said in full once, under FINDING
                lines.append(f"  {'':<{width}}  -> {r.kind_label}: see the finding below")
            elif r.verdict in ("error", "n/a", "warn", "declared") and r.reason:
                lines.append(f"  {'':<{width}}  -> {r.reason}")
    return "\n".join(lines)


def findings(results: Iterable[CheckResult]) -> str:
    """What is true of the layer and is not a failure, by kind, each said once: a precision policy,
    a defect inherited from a function it calls, behaviour its library leaves unspecified, an
    argument it takes and ignores. Never hidden, never counted as a failure."""
    by_kind: dict[str, dict[str, list[str]]] = {}
    for r in results:
        if r.kind is not None and r.reason:
            by_kind.setdefault(r.kind_label or r.kind, {}).setdefault(r.reason, []).append(r.name)
    out: list[str] = []
    for label, reasons in by_kind.items():
        for reason, names in reasons.items():
            out.append(f"\nFINDING ({label}), not a failure: {', '.join(names)}")
            out.append(f"  {reason}")
    return "\n".join(out)


_DECORATOR = re.compile(r"@(?:reproduce_failure|seed)\([^)]*\)")


def hypothesis_hint(note: str) -> str:
    """Hypothesis's note on a failure, for someone at a command line: its decorator replays the example in
    a pytest test of their own; the replay command needs none ("add it to your test function" otherwise
    reads as an instruction about the CLI)."""
    m = _DECORATOR.search(note)
    if m is None:
        return note.strip()
    return f"pytest:  {m.group(0)} on a test of your own replays this example (the replay command needs nothing)"


def failures(results: Iterable[CheckResult]) -> str:
    """Each failure: what went wrong, the shrunk counterexample and the command that replays it.

    Failures with one root cause (``report_groups.group_failures``) are shown once, in full,
    followed by one line per failure of the same cause with its replay command.
    """
    out: list[str] = []
    for r, same in group_failures(results):
        out.append(f"\nFAILED {r.stage}/{r.name}")
        if r.reason:
            out.append(f"  what:    {r.reason}")
        if r.counterexample:
            out.append(f"  example: {r.counterexample}")
        if r.replay:
            out.append(f"  replay:  {r.replay}")
        for note in r.details.get("hypothesis", []):
            out.append(f"  {hypothesis_hint(note)}")
        if same:
            out.append(f"  same cause (a NaN or inf output) fails {len(same)} more check{'s' * (len(same) > 1)}:")
            for s in same:
                out.append(f"    FAILED {s.stage}/{s.name}" + (f"  replay: {s.replay}" if s.replay else ""))
    return "\n".join(out)


def summary(results: Iterable[CheckResult]) -> str:
    """'N passed, N failed' and the other verdicts' counts, on one line; findings by kind."""
    rows = list(results)
    count = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
    kinds = {label: sum(r.kind == kind for r in rows) for kind, label in KINDS.items()}
    found = "".join(f", {n} {label}" for label, n in kinds.items() if n)
    findings = f"{count['finding']} finding{'' if count['finding'] == 1 else 's'}"
    errors = f", {count['error']} raised in mha-verify (no verdict)" if count["error"] else ""
    return (f"{count['pass']} passed, {count['fail']} failed{errors}, {count['warn']} warned, "
            f"{count['declared']} declared, {findings}, {count['n/a']} not applicable{found}")
