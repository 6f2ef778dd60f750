"""Symmetries: permutations of queries and of keys, and independence of batch items."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from properties.adapters import Conventions
from properties.checks import Measure, close, examples_for, relation_allowed
from properties.registry import invariant
from properties.strategies import AttnExample
from properties.targets import Bound


def _perm(n: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def _full_mask(ex: AttnExample) -> torch.Tensor | None:
    """The example's mask expanded to (B, H, Lq, Lk) in its own convention."""
    return None if ex.mask is None else ex.mask.expand(ex.sizes.mask_target())


@invariant("query_permutation")
def query_permutation(bound: Bound, ex: AttnExample) -> Measure:
    """Permuting query positions permutes the output rows the same way.

    out(q[:, P], k, v, M[..., P, :]) = out(q, k, v, M)[:, P] for a permutation P of Lq.
    A self-attention target permutes x (and both mask axes): out(x[:, P]) = out(x)[:, P].
    """
    p = _perm(ex.sizes.lq, ex.seed)
    mask = _full_mask(ex)
    out = bound(ex.q, ex.k, ex.v, mask)
    if bound.conventions.cross_attention:
        out_p = bound(ex.q[:, p], ex.k, ex.v, None if mask is None else mask[..., p, :])
    else:
        x = ex.q[:, p]
        out_p = bound(x, x, x, None if mask is None else mask[..., p, :][..., p])
    return close(out_p, out[:, p], relation_allowed(bound, ex), "output for permuted queries vs permuted output")


def _cross(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.cross_attention:
        return "self-attention only: keys cannot be permuted without permuting queries"
    return examples_for(conv)


@invariant("key_permutation", strategy=_cross)
def key_permutation(bound: Bound, ex: AttnExample) -> Measure:
    """Permuting key and value positions together (and the mask's columns) leaves the output unchanged.

    out(q, k[:, P], v[:, P], M[..., P]) = out(q, k, v, M) for a permutation P of Lk.
    """
    p = _perm(ex.sizes.lk, ex.seed + 1)
    mask = _full_mask(ex)
    out = bound(ex.q, ex.k, ex.v, mask)
    out_p = bound(ex.q, ex.k[:, p], ex.v[:, p], None if mask is None else mask[..., p])
    return close(out_p, out, relation_allowed(bound, ex), "output for permuted keys/values vs original")


@invariant("batch_independence")
def batch_independence(bound: Bound, ex: AttnExample) -> Measure:
    """Each batch item's output equals that item computed alone, whatever the other items hold.

    out(q, k, v, M)[b] = out(q[b:b+1], k[b:b+1], v[b:b+1], M[b:b+1])[0] for every b; the
    strategies give items magnitudes from 1e-3 to 1e3 side by side.
    """
    mask = _full_mask(ex)
    out = bound(ex.q, ex.k, ex.v, mask)
    allowed = relation_allowed(bound, ex)
    measure = Measure(0.0, allowed)
    for b in range(ex.sizes.batch):
        alone = bound(ex.q[b:b + 1], ex.k[b:b + 1], ex.v[b:b + 1], None if mask is None else mask[b:b + 1])
        m = close(alone, out[b:b + 1], allowed, f"item {b} computed alone vs in the batch")
        measure = max(measure, m, key=lambda x: x.error)
    return measure
