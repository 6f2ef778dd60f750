"""A sweep's rows: one per class of the library, what happened to it, and the totals."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: statuses of a row; "passed" and "failed" are the gate's verdicts on a built class
STATUSES = ("not built", "wrapper", "hung while built", "crashed while built", "built", "passed", "failed",
            "nothing verified", "check timed out", "check crashed", "check usage error")
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
    build_seconds: float = 0.0
    check_seconds: float = 0.0


_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")


def cause_of(reason: str) -> str:
    """A failure's reason with its numbers masked, so that the same cause groups across checks."""
    first = (reason.strip().splitlines() or [""])[0]
    return _NUMBER.sub("#", first)[:200]


def totals(rows: list[Row]) -> dict[str, int]:
    """The sweep's counts: found, built (with no user code), verified (a check compared an
    example), passed, failed, and each other status."""
    count = {s: sum(r.status == s for r in rows) for s in STATUSES}
    built = sum(r.status not in (*UNBUILT, "") for r in rows)
    return {"found": len(rows), "built": built, "verified": sum(r.verified > 0 for r in rows),
            "passed": count["passed"], "failed": count["failed"],
            **{s: n for s, n in count.items() if s not in ("passed", "failed", "built") and n}}
