"""Causality: a causal layer's row i depends on positions <= i only, and a prefix of the input
gives the prefix of the output.

A causal target (an ``is_causal``/``causal`` attribute, a triangular buffer, SDPA called
with ``is_causal=True``, or a declaration) is checked as it is. A target that is not causal but
takes a mask is checked under a causal keep-mask ANDed into the example's: a mask that hides
the future must hide it. Targets with neither: n/a. Causality is aligned as the target declares
(:data:`mha.masks.CAUSAL_ALIGNMENTS`): top-left, query i sees keys j <= i (SDPA's ``is_causal``,
and the mask ANDed into a non-causal target's), or bottom-right, query i sees keys j <= i + off
with off = Lk - Lq (a KV-cache decode step). Bottom-right with Lq != Lk cuts the keys at t and
compares the rows i <= t - off, and takes prefixes of n queries with n + off keys; with Lq = Lk
both alignments are the same and so are the checks.
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

from mha_verify.mha.masks import additive_mask, causal_keep, causal_offset
from mha_verify.properties.engine.applicable import comparable_rows, examples_for, mixed_positions
from mha_verify.properties.engine.measure import Measure, close, relation_allowed
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Conventions, Instance
from mha_verify.properties.strategies.examples import AttnExample

#: the mask forms that can carry a causal mask: those with a query axis
_PER_QUERY = frozenset({"BHLL", "B1LL", "11LL", "LL"})


def _causal(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    mixed = mixed_positions(conv, causal_laws=True)
    if mixed:
        return mixed
    if not conv.causal and not conv.mask:
        return ("the target is neither causal (no is_causal attribute, no causal=True declaration) nor takes a mask "
                "to make it causal")
    if not conv.causal and not conv.mask_forms & _PER_QUERY:
        return (f"the target is not causal and takes masks of shapes {', '.join(sorted(conv.mask_forms))} only: "
                "none has a query axis, so no mask can make it causal")
    if not conv.causal:  # a causal mask is ANDed into the drawn one: drawn in a form that can hold it
        conv = dataclasses.replace(conv, mask_forms=conv.mask_forms & _PER_QUERY)
    return examples_for(conv, min_len=2)


def _causal_example(bound: Instance, ex: AttnExample) -> AttnExample:
    """The example as is for a causal target; else with a causal keep-mask ANDed into its mask."""
    if bound.conventions.causal:
        return ex
    causal = causal_keep(ex.sizes.lq, ex.sizes.lk)  # (Lq, Lk); ANDed below into a mask drawn with a query axis
    if ex.mask is None:
        causal = _in_taken_form(causal, bound.conventions.mask_forms, ex)
        mask = causal if "bool" in bound.conventions.mask else additive_mask(causal, ex.q.dtype)
    elif ex.mask.dtype == torch.bool:
        mask = ex.mask & causal
    else:
        bias = additive_mask(causal, ex.mask.dtype)
        assert bias is not None
        mask = ex.mask + bias
    return ex._replace(mask=mask)


def _in_taken_form(causal: torch.Tensor, forms: frozenset[str], ex: AttnExample) -> torch.Tensor:
    """The causal (Lq, Lk) mask in the first form with a query axis the target takes."""
    s = ex.sizes
    shapes = {"LL": (s.lq, s.lk), "11LL": (1, 1, s.lq, s.lk), "B1LL": (s.batch, 1, s.lq, s.lk),
              "BHLL": (s.batch, s.n_head, s.lq, s.lk)}
    return causal.expand(next(shape for form, shape in shapes.items() if form in forms))


def _rows(bound: Instance, ex: AttnExample, n: int) -> torch.Tensor | None:
    """(B, n) rows to compare: all of them, or those not fully masked where the target declares
    NaN or uniform weights there (``fully_masked_rows`` checks those)."""
    if bound.conventions.fully_masked == "zeros":
        return None
    return comparable_rows(ex, bound.conventions.causal)[:, :n]


def _offset(bound: Instance, ex: AttnExample) -> int:
    """How many keys past its own index query i sees: Lk - Lq for a bottom-right causal target, else 0."""
    causal = bound.conventions.causal
    return causal_offset(ex.sizes.lq, ex.sizes.lk, causal) if causal else 0


def _draw(low: int, high: int, seed: int) -> int:
    """An int in [low, high), drawn from the example's seed."""
    return int(torch.randint(low, high, (1,), generator=torch.Generator().manual_seed(seed)))


def _cut(ex: AttnExample, off: int = 0) -> int:
    """The last key position t kept unchanged, drawn from the example's seed: 0 <= t < min(Lq, Lk) - 1
    with ``off`` 0; else max(0, off) <= t < Lk - 1, so that rows 0..t - off see keys <= t only and one
    row at least does (Lq >= 2)."""
    if off == 0:
        return _draw(0, min(ex.sizes.lq, ex.sizes.lk) - 1, ex.seed)
    return _draw(max(0, off), ex.sizes.lk - 1, ex.seed)


def _crop_mask(mask: torch.Tensor | None, nq: int, nk: int, lq: int) -> torch.Tensor | None:
    """The mask restricted to the first nq queries and nk keys (axes of size 1 stay broadcast)."""
    if mask is None:
        return None
    mask = mask[..., :nk] if mask.shape[-1] > 1 else mask
    if mask.dim() >= 2 and mask.shape[-2] == lq and lq > 1:
        mask = mask[..., :nq, :]
    return mask


@invariant("no_future_leak", strategy=_causal)
def no_future_leak(bound: Instance, ex: AttnExample) -> Measure:
    """Output rows i <= t do not change when the inputs after position t change (causal, or under a causal mask).

    With x'[:, j] = x[:, j] for j <= t and other values after t (queries, keys and values):
    out(x')[:, :t+1] = out(x)[:, :t+1], within twice the derived tolerance. Bottom-right aligned with
    off = Lk - Lq != 0: keys and values after t change, and rows 0..t - off are compared.
    """
    ex = _causal_example(bound, ex)
    off = _offset(bound, ex)
    t = _cut(ex, off)
    last = t - off  # the last row that sees keys <= t only
    gen = torch.Generator().manual_seed(ex.seed + 7)

    def changed(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        noise = torch.randn(y[:, t + 1:].shape, generator=gen, dtype=torch.float64) * 3.0
        y[:, t + 1:] = noise.to(y.dtype) * x.detach().abs().amax().clamp(min=1.0)
        return y

    out = bound(ex.q, ex.k, ex.v, ex.mask)
    if bound.conventions.cross_attention:
        q2, k2 = ex.q, changed(ex.k)
        v2 = k2 if ex.v is ex.k else changed(ex.v)  # keys = values, one argument: changed together
    else:
        q2 = changed(ex.q)
        k2 = v2 = q2
    out2 = bound(q2, k2, v2, ex.mask)
    return close(out2[:, :last + 1], out[:, :last + 1], relation_allowed(bound, ex),
                 f"rows 0..{last} after changing positions > {t} vs before (a causal row must not see later positions)"
                 if off == 0 else f"rows 0..{last} after changing keys > {t} vs before (bottom-right aligned, "
                 f"Lk - Lq = {off}: row i must not see keys past i + {off})",
                 rows=_rows(bound, ex, last + 1))


@invariant("prefix_consistency", strategy=_causal)
def prefix_consistency(bound: Instance, ex: AttnExample) -> Measure:
    """The first n positions alone give the first n output rows (causal, or under a causal mask).

    out(x[:, :n], M[..., :n, :n]) = out(x, M)[:, :n] for 1 <= n < L: what a causal layer
    computes for a prefix does not depend on what follows it (incremental decoding relies on it).
    Bottom-right aligned with off = Lk - Lq != 0: the first n queries with the first n + off keys.
    """
    ex = _causal_example(bound, ex)
    off = _offset(bound, ex)
    n = _cut(ex) + 1 if off == 0 else _draw(max(1, 1 - off), ex.sizes.lq, ex.seed)
    nk = n + off  # keys of the prefix: the same offset, so each of its queries sees what it saw
    out = bound(ex.q, ex.k, ex.v, ex.mask)
    mask = _crop_mask(ex.mask, n, nk, ex.sizes.lq)
    # contiguous copies: a sliced tensor is not, and layers may view() their input (HF's Conv1D)
    if bound.conventions.cross_attention:
        short = bound(ex.q[:, :n].contiguous(), ex.k[:, :nk].contiguous(), ex.v[:, :nk].contiguous(), mask)
    else:
        x = ex.q[:, :n].contiguous()
        short = bound(x, x, x, mask)
    return close(short, out[:, :n], relation_allowed(bound, ex),
                 f"output of the first {n} positions alone vs the first {n} rows of the whole sequence" if off == 0
                 else f"output of the first {n} queries with the first {nk} keys alone vs the first {n} rows of the "
                 f"whole (bottom-right aligned)",
                 rows=_rows(bound, ex, n))
