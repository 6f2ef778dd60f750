"""Building blocks of the invariants: measurements, violations, oracle and tolerance helpers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from mha.reference import multi_head
from mha.tolerance import Comparison, compare, tolerance_for
from properties.adapters import Conventions
from properties.strategies import MASK_KINDS, AttnExample, MaskSpec, Sizes, attention_examples, mask_specs, sizes
from properties.targets import Bound


@dataclass(frozen=True)
class Measure:
    """What one example measured: the error and the error allowed (0/0 for exact checks).

    ``declared`` marks an example where the target behaved as it declared rather than as the
    contract says (e.g. NaN on fully masked rows); ``remark`` carries a warning.
    """

    error: float = 0.0
    allowed: float = 0.0
    declared: bool = False
    remark: str | None = None


class Violation(AssertionError):  # noqa: N818 -- a verdict, not an error
    """An invariant does not hold; the message says what was expected and what came."""

    def __init__(self, message: str, error: float = math.inf, allowed: float = 0.0) -> None:
        super().__init__(message)
        self.error = error
        self.allowed = allowed


def ensure(comparison: Comparison, what: str) -> Measure:
    """Measure from a Comparison, raising a Violation that names ``what`` if it failed."""
    __tracebackhide__ = True
    if not comparison.ok:
        raise Violation(f"{what}: {comparison}", comparison.error, comparison.allowed)
    return Measure(comparison.error, comparison.allowed)


def oracle(bound: Bound, ex: AttnExample, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
           v: torch.Tensor | None = None, mask: torch.Tensor | str | None = "same"
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(oracle output (float64), oracle weights (float64), same-precision output) with the target's weights."""
    q = ex.q if q is None else q
    k = ex.k if k is None else k
    v = ex.v if v is None else v
    m = ex.mask if isinstance(mask, str) else mask
    params = bound.params()
    ref, ref_w = multi_head(q, k, v, params, bound.n_head, m)
    same, _ = multi_head(q, k, v, params, bound.n_head, m, dtype=q.dtype)
    return ref, ref_w, same


def relation_allowed(bound: Bound, ex: AttnExample) -> float:
    """Tolerance for a relation between two outputs of the target (e.g. permuted vs not).

    Each side may stray from the oracle by the derived tolerance, so their difference may be
    up to twice that.
    """
    ref, _, same = oracle(bound, ex)
    c = compare(same, ref, same, ex.q.dtype)
    return 2.0 * tolerance_for(ex.q.dtype).allowed(c.ref_error, c.scale)


def close(actual: torch.Tensor, expected: torch.Tensor, allowed: float, what: str,
          rows: torch.Tensor | None = None) -> Measure:
    """max|actual - expected| <= allowed (over ``rows`` (B, Lq) if given), else a Violation."""
    __tracebackhide__ = True
    a, e = actual.detach().double(), expected.detach().double()
    if rows is not None:
        a, e = a[rows], e[rows]
    if a.numel() == 0:
        return Measure(0.0, allowed)
    diff = (a - e).abs()
    error = float(diff.max()) if bool(torch.isfinite(diff).all()) else math.inf
    if error > allowed:
        raise Violation(f"{what}: max difference {error:.3g} > allowed {allowed:.3g}", error, allowed)
    return Measure(error, allowed)


def keep_of(ex: AttnExample) -> torch.Tensor:
    """The example's keep-mask expanded to (B, H, Lq, Lk) (all True without a mask)."""
    s = ex.sizes
    if ex.mask is None:
        return torch.ones(s.mask_target(), dtype=torch.bool)
    keep = ex.mask if ex.mask.dtype == torch.bool else ex.mask > -math.inf
    return keep.expand(s.mask_target())


def dead_rows(ex: AttnExample) -> torch.Tensor:
    """bool (B, H, Lq): query rows of a head with every key masked."""
    return ~keep_of(ex).any(dim=-1)


def clean_rows(ex: AttnExample) -> torch.Tensor:
    """bool (B, Lq): output rows with no dead head row (comparable for any convention)."""
    return ~dead_rows(ex).any(dim=1)


def _mask_conventions(conv: Conventions) -> tuple[str, ...]:
    out: list[str] = []
    if "bool" in conv.mask:
        out.append("bool")
    if "float" in conv.mask:
        out += ["float", "float_bias"]
    return tuple(out)


def examples_for(
    conv: Conventions,
    *,
    kinds: tuple[str, ...] = MASK_KINDS,
    shapes: st.SearchStrategy[Sizes] | None = None,
    scales: st.SearchStrategy[float] | None = None,
    dtype: torch.dtype = torch.float32,
    need_mask: bool = False,
) -> st.SearchStrategy[AttnExample] | str:
    """Examples the target can take, or the reason (a str) why the property cannot apply.

    Self-attention-only targets get q = k = v; targets without a mask get no mask; targets
    that declare NaN on fully masked rows get examples without such rows (the
    ``fully_masked_rows`` property checks their declaration separately).
    """
    conventions = _mask_conventions(conv)
    if not conventions:
        if need_mask:
            return "the target's forward takes no mask"
        kinds = ("none",)
    elif need_mask:
        kinds = tuple(k for k in kinds if k != "none")
    if shapes is None:
        shapes = sizes()
    if not conv.cross_attention:
        shapes = shapes.map(lambda s: s._replace(lk=s.lq))
    masks: st.SearchStrategy[MaskSpec] = mask_specs(kinds=kinds, conventions=conventions or ("bool",))
    strategy = attention_examples(shapes=shapes, masks=masks, scales=scales, dtype=dtype)
    if not conv.cross_attention:
        strategy = strategy.map(lambda ex: ex._replace(k=ex.q, v=ex.q))
    if conv.fully_masked != "zeros":
        strategy = strategy.filter(lambda ex: not bool(dead_rows(ex).any()))
    return strategy


CheckFn = Callable[[Bound, AttnExample], Measure]
