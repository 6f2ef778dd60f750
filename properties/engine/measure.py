"""What one example measured: Measure and Violation, and the comparisons that produce them
(against the float64 oracle with the derived tolerance, or between two outputs of the target)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mha_verify.mha.reference import multi_head, same_precision
from mha_verify.mha.tolerance import Comparison, compare, tolerance_for
from mha_verify.properties.protocol import Instance, NotApplicable
from mha_verify.properties.strategies.examples import AttnExample


@dataclass(frozen=True)
class Measure:
    """What one example measured: the error and the error allowed (0/0 for exact checks).

    ``checked`` is False for an example that compared nothing (no row to compare, no masked
    key, a permutation of one position, a tolerance that is not finite): it is not a pass and
    is not counted. ``declared`` marks an example where the target behaved as it declared
    rather than as the contract says (e.g. NaN on fully masked rows); ``remark`` carries a
    warning; ``finding`` is (kind, evidence) for what is true and not a defect under the layer's
    own contract (a key of :data:`~mha_verify.properties.engine.results.KINDS`: torch's SDPA
    accepting what the layer passed through is "inherited").
    """

    error: float = 0.0
    allowed: float = 0.0
    declared: bool = False
    remark: str | None = None
    checked: bool = True
    finding: tuple[str, str] | None = None


UNCHECKED = Measure(checked=False)


class Violation(AssertionError):  # noqa: N818 -- a verdict, not an error
    """An invariant does not hold; the message says what was expected and what came."""

    def __init__(self, message: str, error: float = math.inf, allowed: float = 0.0) -> None:
        super().__init__(message)
        self.error = error
        self.allowed = allowed


def ensure(comparison: Comparison, what: str) -> Measure:
    """Measure from a Comparison, raising a Violation that names ``what`` if it failed.

    A comparison whose allowance is not finite (the same-precision formula itself overflowed)
    checked nothing.
    """
    __tracebackhide__ = True
    if not math.isfinite(comparison.allowed):
        return UNCHECKED
    if not comparison.ok:
        raise Violation(f"{what}: {comparison}", comparison.error, comparison.allowed)
    return Measure(comparison.error, comparison.allowed)


def oracle(bound: Instance, ex: AttnExample, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
           v: torch.Tensor | None = None, mask: torch.Tensor | str | None = "same"
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(oracle output (float64), oracle weights (float64), same-precision output) with the target's
    weights, applying the target's causality and fully-masked convention."""
    q = ex.q if q is None else q
    k = ex.k if k is None else k
    v = ex.v if v is None else v
    m = ex.mask if isinstance(mask, str) else mask
    params = bound.params()
    conv = bound.conventions
    ref, ref_w = multi_head(q, k, v, params, bound.n_head, m, causal=conv.causal, fully_masked=conv.fully_masked,
                            scoring=conv.scoring)
    same, _ = same_precision(q, k, v, params, bound.n_head, m, dtype=q.dtype, oracle=ref, causal=conv.causal,
                             fully_masked=conv.fully_masked, scoring=conv.scoring)
    return ref, ref_w, same


def relation_allowed(bound: Instance, ex: AttnExample, item: int | None = None) -> float:
    """Tolerance for a relation between two outputs of the target (e.g. permuted vs not).

    Each side may stray from the oracle by the derived tolerance, so their difference may be
    up to twice that. Derived from the outputs where the oracle is finite: a target declaring NaN
    on fully masked rows has NaN oracle rows there, and a NaN allowance would pass everything
    (``error > nan`` is False). Where the same-precision formula itself overflows, the allowance
    is not finite, and the comparisons treat the example as unchecked. ``item``: for a layer held by the
    laws alone, the allowance measured on that batch item's rows of the call on ``ex`` (the other side of a
    relation with the item computed alone); the oracle's allowance is the example's as a whole.
    """
    if bound.conventions.beyond:
        return _own_allowed(bound, ex, item)
    ref, _, same = oracle(bound, ex)
    finite = torch.isfinite(ref)
    c = compare(same[finite], ref[finite], same[finite], ex.q.dtype)
    return 2.0 * tolerance_for(ex.q.dtype).allowed(c.ref_error, c.scale)


def _own_allowed(bound: Instance, ex: AttnExample, item: int | None = None) -> float:
    """The relation tolerance of a layer the oracle does not model (``Conventions.beyond``): the
    same rule, with the layer as its own same-precision reference. Its output is held against its
    own float64 forward (the same weights widened): that distance is its rounding, as the
    same-precision formula's is the oracle's. NotApplicable where the target cannot be widened
    (an exported model has its dtype)."""
    widen = getattr(bound, "in_float64", None)
    if widen is None:
        raise NotApplicable("laws only: the target has no float64 forward to measure its rounding against")
    wide = widen()

    widened: dict[int, torch.Tensor] = {}  # one tensor stays one (self-attention's q = k = v)
    q, k, v = (widened.setdefault(id(t), t.detach().double()) for t in (ex.q, ex.k, ex.v))
    mask = ex.mask.double() if ex.mask is not None and ex.mask.is_floating_point() else ex.mask
    with torch.no_grad():
        same = bound(ex.q, ex.k, ex.v, ex.mask).detach()
        ref = wide(q, k, v, mask).detach()
    if item is not None:
        same, ref = same[item:item + 1], ref[item:item + 1]
    finite = torch.isfinite(ref) & torch.isfinite(same)
    c = compare(same[finite], ref[finite], same[finite], ex.q.dtype)
    return 2.0 * tolerance_for(ex.q.dtype).allowed(c.ref_error, c.scale)


def close(actual: torch.Tensor, expected: torch.Tensor, allowed: float, what: str,
          rows: torch.Tensor | None = None) -> Measure:
    """max|actual - expected| <= allowed (over ``rows`` (B, Lq) if given), else a Violation.

    No row to compare, or an allowance that is not finite, checked nothing.
    """
    __tracebackhide__ = True
    a, e = actual.detach().double(), expected.detach().double()
    if rows is not None:
        a, e = a[rows], e[rows]
    if a.numel() == 0 or not math.isfinite(allowed):
        return UNCHECKED
    diff = (a - e).abs()
    error = float(diff.max()) if bool(torch.isfinite(diff).all()) else math.inf
    if error > allowed:
        raise Violation(f"{what}: max difference {error:.3g} > allowed {allowed:.3g}", error, allowed)
    return Measure(error, allowed)


def worst(*measures: Measure) -> Measure:
    """The measure that used most of its allowance among those that checked something."""
    checked = [m for m in measures if m.checked]
    if not checked:
        return UNCHECKED
    return max(checked, key=lambda m: m.error / m.allowed if m.allowed > 0 else (0.0 if m.error == 0 else math.inf))


CheckFn = Callable[[Instance, AttnExample], Measure]
RelationFn = Callable[[Instance, Instance, AttnExample], Measure]


def no_dropout_here(bound: Instance, ex: AttnExample) -> None:
    """NotApplicable where the layer, built at this example's sizes, holds no dropout at all: a layer
    whose structure depends on its sizes (vit-pytorch's ``to_out`` is an identity, with no dropout, for one
    head as wide as the input) declares dropout at the sizes it was read at, not at these."""
    if not bound.conventions.dropout:
        raise NotApplicable(f"built at D={ex.sizes.d_model}, H={ex.sizes.n_head} the layer holds no dropout "
                            "(its structure depends on its sizes)")


def error_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's first line in at most ``limit`` characters for a report: its start and its end,
    where runtimes put the cause (onnxruntime: "Status Message: FILE:LINE SIGNATURE ... was false.
    inconsistent q_sequence_length ...")."""
    first = (str(exc).strip().splitlines() or [""])[0]
    if len(first) <= limit:
        return first
    half = (limit - 3) // 2
    return f"{first[:half]} … {first[-half:]}"

