"""Verification results as data: the property runner and the export stage return these,
and the CLI formats them (checks never print)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

VERDICTS = ("pass", "fail", "error", "warn", "declared", "finding", "n/a")

#: what a finding that is not a failure is, as a maintainer of the layer's library would read it:
#: each decided from evidence the harness measured or read from the layer's code, never from a name
KINDS: dict[str, str] = {
    # float64 inputs computed through a float32 (or lower) step the library chose: a float64
    # check's premise does not hold; the layer is still held in the dtypes it works in
    "precision_policy": "precision policy",
    # the defect is in a function the layer calls with what it was given (torch's SDPA), shown
    "inherited": "inherited",
    # behaviour its library declares don't-care (HF's fully masked padding rows); finite is still required
    "unspecified": "unspecified by its library",
    # an argument its forward takes and, by its own source, does not use
    "ignored": "argument accepted and ignored",
    # an input outside a precondition the tool that made the model documents (onnxruntime's fused
    # attention reads the mask as lengths: right padding only), measured and said
    "precondition": "outside a documented precondition",
    # a check against the oracle, n/a for a layer that takes a step the oracle does not model (a gate,
    # a relative-position table): the layer is held by the laws alone, and the step is named
    "beyond": "beyond the oracle (laws only)",
}


@dataclass
class CheckResult:
    """The outcome of one check (a property, or one export/validation configuration).

    verdict: "pass"; "fail"; "error" (a check of mha-verify itself raised: no verdict on the target,
    and never a green run: the CLI exits 3 where nothing failed); "warn" (passed, with a remark
    such as an exception type that is not ValueError/TypeError); "declared" (the target documents
    another convention, e.g. NaN on fully masked rows, and behaved as it declared); "finding"
    (true, and not a defect under the layer's own contract: ``kind`` says what it is, ``reason``
    the evidence); "n/a" (cannot apply to this target: ``reason`` says why; never counted as passed).
    kind: a key of :data:`KINDS` for a finding (required) or an n/a whose cause is one (a float64
    gradcheck of a layer that computes float64 at float32 is n/a by its precision policy); None else.
    worst_error / allowed: the largest error seen and the tolerance allowed at that example.
    """

    name: str
    stage: str
    verdict: str
    examples: int = 0
    worst_error: float | None = None
    allowed: float | None = None
    seconds: float = 0.0
    counterexample: str | None = None
    replay: str | None = None
    reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    kind: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got verdict={self.verdict!r}")
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)} or None, got kind={self.kind!r}")
        if (self.verdict == "finding") != (self.kind is not None) and self.verdict != "n/a":
            raise ValueError(f"a finding needs a kind and only a finding or n/a has one: verdict={self.verdict!r}, "
                             f"kind={self.kind!r}")

    @property
    def kind_label(self) -> str | None:
        """The kind in words ("precision policy", "unspecified by its library"...), or None."""
        return None if self.kind is None else KINDS[self.kind]

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    @property
    def errored(self) -> bool:
        """A check of mha-verify raised: what it checked has no verdict."""
        return self.verdict == "error"

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (inf and NaN errors become strings)."""
        out = asdict(self)
        for key in ("worst_error", "allowed"):
            value = out[key]
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = str(value)
        return out

    @classmethod
    def from_json(cls, data: object) -> CheckResult:
        """The CheckResult that :meth:`to_json` wrote, read as data: every field's type is checked
        and a bad one is a ValueError naming it (a report is a user's file, not ours).

        >>> r = CheckResult("x", "properties", "pass", worst_error=float("inf"))
        >>> CheckResult.from_json(r.to_json()) == r
        True
        """
        if not isinstance(data, dict):
            raise ValueError(f"a result must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_FIELD_TYPES))
        if unknown:
            raise ValueError(f"a result has unknown fields {unknown[:5]}")
        missing = [k for k in ("name", "stage", "verdict") if k not in data]
        if missing:
            raise ValueError(f"a result lacks {missing}")
        out: dict[str, Any] = {}
        for key, value in data.items():
            kinds = _FIELD_TYPES[key]
            special = key in ("worst_error", "allowed") and value in ("inf", "-inf", "nan")
            whole = key in ("worst_error", "allowed", "seconds") and isinstance(value, int) and \
                not isinstance(value, bool)
            if special or whole:
                value = float(value)
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise ValueError(f"result field {key!r} has the wrong type: {type(value).__name__}")
            out[key] = value
        return cls(**out)

    def __str__(self) -> str:
        err = "" if self.worst_error is None else f", worst error {self.worst_error:.3g}"
        tol = "" if self.allowed is None else f" (allowed {self.allowed:.3g})"
        why = f": {self.reason}" if self.reason else ""
        kind = f" ({self.kind_label})" if self.kind else ""
        return f"{self.stage}/{self.name}: {self.verdict}{kind} after {self.examples} examples{err}{tol}{why}"


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "stage": (str,), "verdict": (str,), "examples": (int,), "worst_error": (float, type(None)),
    "allowed": (float, type(None)), "seconds": (float,), "counterexample": (str, type(None)),
    "replay": (str, type(None)), "reason": (str, type(None)), "details": (dict,), "kind": (str, type(None)),
}
