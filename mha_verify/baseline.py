"""Regression baselines: the worst error of each check, stored once and held against later runs.

A numerical regression that is still inside the tolerance shows here before it becomes a
bug: a check fails when its worst error grows past ``budget`` times the stored one (plus a
floor of 1e-3 of its allowed error, so that a stored 0 does not turn roundoff into a failure).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from mha_verify.export.atomic import AtomicWriter
from mha_verify.properties.results import CheckResult

FORMAT = "mha-verify-baseline/1"


def load(path: str) -> dict[str, float]:
    """{stage/name: worst error}; ValueError naming the file if it is not a baseline."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"baseline {path!r} is unreadable: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("worst"), dict):
        raise ValueError(f"baseline {path!r} is not an mha-verify baseline (format {FORMAT})")
    return {str(k): float(v) for k, v in doc["worst"].items()}


def document(results: Sequence[CheckResult]) -> str:
    worst = {f"{r.stage}/{r.name}": r.worst_error for r in results
             if r.worst_error is not None and math.isfinite(r.worst_error) and r.verdict != "fail"}
    return json.dumps({"format": FORMAT, "worst": worst}, indent=2, sort_keys=True) + "\n"


def store(results: Sequence[CheckResult], writer: AtomicWriter) -> None:
    writer.write_text(document(results))


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
