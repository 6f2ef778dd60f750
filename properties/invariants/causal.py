"""Causality: a causal layer's row i depends on positions <= i only, and a prefix of the input
gives the prefix of the output.

A causal target (an ``is_causal``/``causal`` attribute, a triangular buffer, SDPA called
with ``is_causal=True``, or a declaration) is checked as it is. A target that is not causal but
takes a mask is checked under a causal keep-mask ANDed into the example's: a mask that hides
the future must hide it. Targets with neither: n/a. Causality is top-left aligned: query i
sees keys j <= i (SDPA's ``is_causal``).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from mha_verify.mha.masks import additive_mask, causal_keep
from mha_verify.properties.engine.applicable import comparable_rows, examples_for
from mha_verify.properties.engine.measure import Measure, close, relation_allowed
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Conventions, Instance
from mha_verify.properties.strategies.examples import AttnExample


def _causal(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.causal and not conv.mask:
        return ("the target is neither causal (no is_causal attribute, no causal=True declaration) nor takes a mask "
                "to make it causal")
    return examples_for(conv, min_len=2)


def _causal_example(bound: Instance, ex: AttnExample) -> AttnExample:
    """The example as is for a causal target; else with a causal keep-mask ANDed into its mask."""
    if bound.conventions.causal:
        return ex
    causal = causal_keep(ex.sizes.lq, ex.sizes.lk)  # (Lq, Lk)
    if ex.mask is None:
        mask = causal if "bool" in bound.conventions.mask else additive_mask(causal, ex.q.dtype)
    elif ex.mask.dtype == torch.bool:
        mask = ex.mask & causal
    else:
        bias = additive_mask(causal, ex.mask.dtype)
        assert bias is not None
        mask = ex.mask + bias
    return ex._replace(mask=mask)


def _rows(bound: Instance, ex: AttnExample, n: int) -> torch.Tensor | None:
    """(B, n) rows to compare: all of them, or those not fully masked where the target declares
    NaN or uniform weights there (``fully_masked_rows`` checks those)."""
    if bound.conventions.fully_masked == "zeros":
        return None
    return comparable_rows(ex, bound.conventions.causal)[:, :n]


def _cut(ex: AttnExample) -> int:
    """The last position t kept unchanged, 0 <= t < min(Lq, Lk) - 1, drawn from the example's seed."""
    n = min(ex.sizes.lq, ex.sizes.lk)
    return int(torch.randint(0, n - 1, (1,), generator=torch.Generator().manual_seed(ex.seed)))


def _crop_mask(mask: torch.Tensor | None, n: int, lq: int) -> torch.Tensor | None:
    """The mask restricted to the first n queries and keys (axes of size 1 stay broadcast)."""
    if mask is None:
        return None
    mask = mask[..., :n] if mask.shape[-1] > 1 else mask
    if mask.dim() >= 2 and mask.shape[-2] == lq and lq > 1:
        mask = mask[..., :n, :]
    return mask


@invariant("no_future_leak", strategy=_causal)
def no_future_leak(bound: Instance, ex: AttnExample) -> Measure:
    """Output rows i <= t do not change when the inputs after position t change (causal, or under a causal mask).

    With x'[:, j] = x[:, j] for j <= t and other values after t (queries, keys and values):
    out(x')[:, :t+1] = out(x)[:, :t+1], within twice the derived tolerance.
    """
    ex = _causal_example(bound, ex)
    t = _cut(ex)
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
    return close(out2[:, :t + 1], out[:, :t + 1], relation_allowed(bound, ex),
                 f"rows 0..{t} after changing positions > {t} vs before (a causal row must not see later positions)",
                 rows=_rows(bound, ex, t + 1))


@invariant("prefix_consistency", strategy=_causal)
def prefix_consistency(bound: Instance, ex: AttnExample) -> Measure:
    """The first n positions alone give the first n output rows (causal, or under a causal mask).

    out(x[:, :n], M[..., :n, :n]) = out(x, M)[:, :n] for 1 <= n < L: what a causal layer
    computes for a prefix does not depend on what follows it (incremental decoding relies on it).
    """
    ex = _causal_example(bound, ex)
    n = _cut(ex) + 1
    out = bound(ex.q, ex.k, ex.v, ex.mask)
    mask = _crop_mask(ex.mask, n, ex.sizes.lq)
    # contiguous copies: a sliced tensor is not, and layers may view() their input (HF's Conv1D)
    if bound.conventions.cross_attention:
        short = bound(ex.q[:, :n].contiguous(), ex.k[:, :n].contiguous(), ex.v[:, :n].contiguous(), mask)
    else:
        x = ex.q[:, :n].contiguous()
        short = bound(x, x, x, mask)
    return close(short, out[:, :n], relation_allowed(bound, ex),
                 f"output of the first {n} positions alone vs the first {n} rows of the whole sequence",
                 rows=_rows(bound, ex, n))
