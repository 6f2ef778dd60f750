"""Regression baselines: the worst error of each check, stored once and held against later runs.

A numerical regression that is still inside the tolerance shows here before it becomes a
bug: a check fails when its worst error grows past ``budget`` times the stored one (plus a
floor of 1e-3 of its allowed error, so that a stored 0 does not turn roundoff into a failure).

A baseline records what it was measured on (target, dtype, profile): one recorded for another
target is refused, not silently applied. Every stored value must be a finite number >= 0 (NaN
would fail every check; Infinity or ``true`` would switch the check off). A run with a failed
check does not replace a baseline, unless asked to, and then keeps the failed checks' old
entries instead of dropping them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from mha_verify.json_files import read_json
from mha_verify.properties.engine.results import CheckResult

FORMAT = "mha-verify-baseline/2"
#: a baseline holds one number per check (~2 KB); anything near this is not one
MAX_BASELINE_BYTES = 16 * 1024 * 1024
CONTEXT_KEYS = ("target", "dtype", "profile")


def _value(path: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"baseline {path!r}: the worst error of {key[:80]!r} must be a finite number >= 0, "
                         f"got {json.dumps(value)[:80]}")
    return float(value)


def load(path: str, context: dict[str, str]) -> dict[str, float]:
    """{stage/name: worst error}; ValueError naming the file and what is wrong: not a baseline, a
    value that is not a finite number >= 0, or recorded for another target, dtype or profile."""
    doc = read_json(path, what=f"baseline {path!r}", max_bytes=MAX_BASELINE_BYTES)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("worst"), dict) \
            or not isinstance(doc.get("context"), dict):
        raise ValueError(f"baseline {path!r} is not an mha-verify baseline (format {FORMAT}); record it again "
                         "with --update-baseline")
    recorded = {k: doc["context"].get(k) for k in CONTEXT_KEYS}
    differs = [f"{k} {repr(recorded[k])[:80]} (this run: {context[k]!r})"
               for k in CONTEXT_KEYS if recorded[k] != context[k]]
    if differs:
        raise ValueError(f"baseline {path!r} was recorded for another run: {'; '.join(differs)}; record it again "
                         "with --update-baseline")
    return {str(k): _value(path, str(k), v) for k, v in doc["worst"].items()}


def previous(path: str) -> dict[str, float]:
    """The worst errors of an existing baseline, checked, whatever it was recorded for ({} if none)."""
    try:
        doc = read_json(path, what=f"baseline {path!r}", max_bytes=MAX_BASELINE_BYTES)
    except ValueError:
        return {}
    worst = doc.get("worst") if isinstance(doc, dict) else None
    return {str(k): _value(path, str(k), v) for k, v in worst.items()} if isinstance(worst, dict) else {}


def document(results: Sequence[CheckResult], context: dict[str, str], kept: dict[str, float] | None = None) -> str:
    """The baseline of ``results``; the checks that failed keep their entry in ``kept`` (never dropped)."""
    worst = {f"{r.stage}/{r.name}": r.worst_error for r in results
             if r.worst_error is not None and math.isfinite(r.worst_error) and r.verdict != "fail"}
    for r in results:
        key = f"{r.stage}/{r.name}"
        if r.verdict == "fail" and kept and key in kept:
            worst[key] = kept[key]
    return json.dumps({"format": FORMAT, "context": context, "worst": worst}, indent=2, sort_keys=True) + "\n"




def compare(results: Sequence[CheckResult], stored: dict[str, float], budget: float) -> list[CheckResult]:
    """One 'baseline' result per check that has a stored worst error."""
    out = []
    for r in results:
        key = f"{r.stage}/{r.name}"
        if key not in stored or r.worst_error is None:
            continue
        old, new = stored[key], r.worst_error
        limit = budget * old + 1e-3 * (r.allowed or 0.0)
        verdict = "pass" if new <= limit else "fail"
        reason = f"worst error {new:.3g} vs baseline {old:.3g} (limit {limit:.3g} = {budget:g} x baseline + floor)"
        out.append(CheckResult(key, "baseline", verdict, examples=r.examples, worst_error=new, allowed=limit,
                               reason=reason))
    return out
