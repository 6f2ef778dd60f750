"""A sweep's rows: one per class of the library, what happened to it, and the totals."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from mha_verify.properties.engine.results import KINDS

#: statuses of a row; "passed" and "failed" are the gate's verdicts on a built class
STATUSES = ("not built", "wrapper", "hung while built", "crashed while built", "built", "passed", "failed",
            "nothing verified", "check timed out", "check crashed", "check usage error",
            "check raised in mha-verify")
#: statuses of a class that was not built with no user code
UNBUILT = ("not built", "wrapper", "hung while built", "crashed while built")


@dataclass
class Row:
    """One class of the library and what happened to it."""

    spec: str
    path: str
    status: str = ""
    built_as: str = ""
    conventions: str = ""
    reason: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    #: checks that compared at least one example (passed, failed, warned or declared)
    verified: int = 0
    #: failure cause (its reason, numbers masked) -> the failing checks
    causes: dict[str, list[str]] = field(default_factory=dict)
    #: findings that are not failures: "kind: reason" (numbers masked) -> the checks that gave it
    findings: dict[str, list[str]] = field(default_factory=dict)
    #: reproduction bundles of its failures, relative to the sweep's folder (``bundles/...``)
    bundles: list[str] = field(default_factory=list)
    build_seconds: float = 0.0
    check_seconds: float = 0.0

    @property
    def verdict_kind(self) -> str:
        """What the class is, by its worst verdict: "FAIL", the first kind of finding it has (in the
        order of :data:`KIND_ORDER`), "passed", or its status (not built, crashed...)."""
        if self.status != "passed":
            return "FAIL" if self.status == "failed" else self.status or "not run"
        kinds = {key.split(":", 1)[0] for key in self.findings}
        return next((k for k in KIND_ORDER if k in kinds), "passed")


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


#: each field of a stored row and the test its value must pass (a sweep.json is a user's file)
_FIELD_CHECKS: dict[str, tuple[str, Any]] = {
    "spec": ("a text", lambda v: isinstance(v, str) and bool(v)),
    "path": ("a text", lambda v: isinstance(v, str)),
    "status": (f"one of {', '.join(STATUSES)}", lambda v: v in STATUSES or v == ""),
    "built_as": ("a text", lambda v: isinstance(v, str)),
    "conventions": ("a text", lambda v: isinstance(v, str)),
    "reason": ("a text", lambda v: isinstance(v, str)),
    "counts": ("{verdict: count}", lambda v: isinstance(v, dict) and all(_count(n) for n in v.values())),
    "verified": ("a count", _count),
    "causes": ("{cause: [check, ...]}", lambda v: isinstance(v, dict) and all(_strings(c) for c in v.values())),
    "findings": ("{finding: [check, ...]}", lambda v: isinstance(v, dict) and all(_strings(c) for c in v.values())),
    "bundles": ("a list of paths", _strings),
    "build_seconds": ("seconds >= 0", _seconds),
    "check_seconds": ("seconds >= 0", _seconds),
}


def row_from_json(item: object, where: str) -> Row:
    """The Row stored as ``item``, every field's type checked; ValueError starting with ``where``
    (the file and the row's place) naming the field, what it must be and what it is."""
    if not isinstance(item, dict):
        raise ValueError(f"{where} is not an object")
    for key in ("spec", "path"):
        if key not in item:
            raise ValueError(f"{where} has no {key!r}")
    for key, (expected, ok) in _FIELD_CHECKS.items():
        if key in item and not ok(item[key]):
            raise ValueError(f"{where}: {key!r} must be {expected}, got {_shown(item[key])}")
    return Row(**{key: item[key] for key in _FIELD_CHECKS if key in item})


def _shown(value: object) -> str:
    text = repr(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


#: the kinds of finding, in the order a class is grouped by (its first)
KIND_ORDER = tuple(KINDS.values())


_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")


def cause_of(reason: str) -> str:
    """A failure's reason with its numbers masked, so that the same cause groups across checks."""
    first = (reason.strip().splitlines() or [""])[0]
    return _NUMBER.sub("#", first)[:200]


def totals(rows: list[Row]) -> dict[str, int]:
    """The sweep's counts: found, built (with no user code), verified (a check compared an
    example), failed (a FAIL), each kind of finding (classes that passed, with a finding of that
    kind first), passed (with no finding), and each other status."""
    count = {s: sum(r.status == s for r in rows) for s in STATUSES}
    built = sum(r.status not in (*UNBUILT, "") for r in rows)
    kinds = {k: sum(r.verdict_kind == k for r in rows) for k in KIND_ORDER}
    return {"found": len(rows), "built": built, "verified": sum(r.verified > 0 for r in rows),
            "failed": count["failed"], **{k: n for k, n in kinds.items() if n},
            "passed": count["passed"] - sum(kinds.values()),
            **{s: n for s, n in count.items() if s not in ("passed", "failed", "built") and n}}
