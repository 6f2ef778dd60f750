"""The one tolerance table, and the rule that derives a tolerance from a reference's error.

The rule follows the kernel test suites of flash-attention and PyTorch's SDPA: an
implementation under test may be wrong by at most a small multiple of the error that a
plain evaluation of the same formula *in the same precision* makes against the float64
result, plus a floor::

    allowed = multiple * max|ref_same - oracle| + atol + rtol * max|oracle|

``ref_same`` is :func:`mha_verify.mha.reference.multi_head` evaluated in the target's dtype and
``oracle`` the same formula in float64, both with the target's own weights. The floor
(``atol``, ``rtol``) covers examples where the plain evaluation happens to be nearly
exact; it is a few units of roundoff of the dtype, so an error that is "small" in absolute
terms but far above roundoff (say float32 scores rounded through float16, ~1e-3) fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    """How far a result in one dtype may stray from the float64 oracle."""

    multiple: float  # of the same-precision reference's error
    atol: float  # absolute floor
    rtol: float  # floor relative to max|oracle|

    def allowed(self, ref_error: float, scale: float) -> float:
        """The allowed max-abs error given the same-precision error and max|oracle|."""
        return self.multiple * ref_error + self.atol + self.rtol * scale


# eps: float64 2.2e-16, float32 1.2e-7, bfloat16 7.8e-3, float16 9.8e-4.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(multiple=4.0, atol=1e-13, rtol=1e-13),
    torch.float32: Tolerance(multiple=4.0, atol=1e-6, rtol=1e-6),
    torch.float16: Tolerance(multiple=4.0, atol=2e-3, rtol=4e-3),
    torch.bfloat16: Tolerance(multiple=4.0, atol=1.6e-2, rtol=3e-2),
}


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    """The table entry for ``dtype``; a clear error for dtypes the table lacks."""
    try:
        return TOLERANCES[dtype]
    except KeyError:
        known = ", ".join(str(d) for d in TOLERANCES)
        raise TypeError(f"no tolerance for dtype={dtype}; known dtypes: {known}") from None


@dataclass(frozen=True)
class Comparison:
    """One result held against the oracle: its error, the allowed error and the verdict."""

    error: float  # max|actual - oracle|
    allowed: float  # from the tolerance rule
    ref_error: float  # max|ref_same - oracle|, what the rule scaled
    scale: float  # max|oracle|
    bound: float = 0.0  # the largest per-element rounding bound subtracted before ``error`` was taken

    @property
    def ok(self) -> bool:
        return self.error <= self.allowed

    def __str__(self) -> str:
        verdict = "within" if self.ok else "exceeds"
        beyond = f" beyond each element's score-rounding bound (up to {self.bound:.3g})" if self.bound > 0 else ""
        return (
            f"max error{beyond} {self.error:.3g} {verdict} allowed {self.allowed:.3g} "
            f"(same-precision reference error {self.ref_error:.3g}, max|oracle| {self.scale:.3g}; "
            f"a tolerance of {self.error:.3g} would have passed)"
        )


def compare(
    actual: torch.Tensor, oracle: torch.Tensor, ref_same: torch.Tensor, dtype: torch.dtype,
    bound: torch.Tensor | None = None,
) -> Comparison:
    """Hold ``actual`` (in ``dtype``) against the float64 ``oracle`` with the derived tolerance.

    Non-finite values in ``actual`` where the oracle is finite count as infinite error. ``bound``
    (the shape of ``oracle``, e.g. :func:`mha.reference.rounding_bound`) is how far each element
    may move for a reason the rule cannot see in one evaluation; the error is what exceeds it.
    """
    oracle = oracle.detach().to(torch.float64)
    diff = (actual.detach().to(torch.float64) - oracle).abs()
    if bound is not None:
        diff = torch.where(torch.isnan(diff), diff, (diff - bound.to(torch.float64)).clamp_min(0.0))
    error = float(diff.max()) if diff.numel() else 0.0
    if diff.numel() and not bool(torch.isfinite(diff).all()):
        error = float("inf")
    ref_diff = (ref_same.detach().to(torch.float64) - oracle).abs()
    ref_error = float(ref_diff.max()) if ref_diff.numel() else 0.0
    scale = float(oracle.abs().max()) if oracle.numel() else 0.0
    most = float(bound.max()) if bound is not None and bound.numel() else 0.0
    return Comparison(error, tolerance_for(dtype).allowed(ref_error, scale), ref_error, scale, most)
