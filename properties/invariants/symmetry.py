"""Symmetries: permutations of queries and of keys, and independence of batch items."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from mha_verify.properties.engine.applicable import examples_for
from mha_verify.properties.engine.measure import Measure, close, relation_allowed, worst
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import LAWS_ONLY, SELF_ONLY, Conventions, Instance
from mha_verify.properties.strategies.examples import AttnExample


def _perm(n: int, seed: int) -> torch.Tensor:
    """A random permutation of n positions that is not the identity (n >= 2)."""
    p = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return p.roll(1) if bool((p == torch.arange(n)).all()) else p


def _positional(conv: Conventions) -> str:
    """Why permuting positions changes this target's output, or "" when it does not."""
    scoring = conv.scoring
    what = [w for w, on in (("rotary embeddings", scoring.rotary is not None),
                            ("position biases", scoring.bias is not None),
                            ("sliding windows", scoring.window is not None)) if on]
    if what:
        return " and ".join(what) + " make the scores depend on positions: permuting them changes the output"
    if conv.beyond_positional:
        return (f"{LAWS_ONLY}: it takes {conv.beyond}, a step beyond the attention the oracle models that depends "
                "on positions: permuting them changes the output")
    return ""


def _positions(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if _positional(conv):
        return _positional(conv)
    return examples_for(conv, min_len=2)


# Masks keep the shape they were drawn in (the target's declared forms: a key-padding-only layer
# takes (B, 1, 1, Lk) and nothing else): an axis is permuted or sliced only where the mask has it.
def _rows_permuted(mask: torch.Tensor | None, p: torch.Tensor) -> torch.Tensor | None:
    return mask[..., p, :] if mask is not None and mask.dim() >= 2 and mask.shape[-2] > 1 else mask


def _keys_permuted(mask: torch.Tensor | None, p: torch.Tensor) -> torch.Tensor | None:
    return mask[..., p] if mask is not None and mask.shape[-1] > 1 else mask


def _item_mask(mask: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """Item b's mask, batch axis kept (size 1); a mask without a batch axis serves every item as it is."""
    return mask[b:b + 1] if mask is not None and mask.dim() == 4 and mask.shape[0] > 1 else mask


@invariant("query_permutation", strategy=_positions,
           causal_forbids="query i sees keys j <= i, so permuting positions changes what each query sees",
           reach="full")
def query_permutation(bound: Instance, ex: AttnExample) -> Measure:
    """Permuting query positions permutes the output rows the same way.

    out(q[:, P], k, v, M[..., P, :]) = out(q, k, v, M)[:, P] for a permutation P of Lq.
    A self-attention target permutes x (and both mask axes): out(x[:, P]) = out(x)[:, P].
    """
    p = _perm(ex.sizes.lq, ex.seed)
    mask = ex.mask
    out = bound(ex.q, ex.k, ex.v, mask)
    if bound.conventions.cross_attention:
        out_p = bound(ex.q[:, p], ex.k, ex.v, _rows_permuted(mask, p))
    else:
        x = ex.q[:, p]
        out_p = bound(x, x, x, _keys_permuted(_rows_permuted(mask, p), p))
    return close(out_p, out[:, p], relation_allowed(bound, ex), "output for permuted queries vs permuted output")


def _cross(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if not conv.cross_attention:
        return f"{SELF_ONLY}: keys cannot be permuted without permuting queries"
    if _positional(conv):
        return _positional(conv)
    return examples_for(conv, min_len=2)


@invariant("key_permutation", strategy=_cross,
           causal_forbids="the order of keys is what the causal mask reads, so permuting them changes the output",
           reach="full")
def key_permutation(bound: Instance, ex: AttnExample) -> Measure:
    """Permuting key and value positions together (and the mask's columns) leaves the output unchanged.

    out(q, k[:, P], v[:, P], M[..., P]) = out(q, k, v, M) for a permutation P of Lk.
    """
    p = _perm(ex.sizes.lk, ex.seed + 1)
    mask = ex.mask
    out = bound(ex.q, ex.k, ex.v, mask)
    out_p = bound(ex.q, ex.k[:, p], ex.v[:, p], _keys_permuted(mask, p))
    return close(out_p, out, relation_allowed(bound, ex), "output for permuted keys/values vs original")


def _batches(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    return examples_for(conv, min_batch=2, mixed_scales=True)


@invariant("batch_independence", strategy=_batches, reach="full")
def batch_independence(bound: Instance, ex: AttnExample) -> Measure:
    """Each batch item's output equals that item computed alone, whatever the other items hold.

    out(q, k, v, M)[b] = out(q[b:b+1], k[b:b+1], v[b:b+1], M[b:b+1])[0] for every b; the
    strategy puts an item of magnitude 1e-3 and one of 1e3 in every batch (B >= 2).
    """
    out = bound(ex.q, ex.k, ex.v, ex.mask)
    measures = []
    for b in range(ex.sizes.batch):
        item = _item(ex, b)
        # each item's own allowance: an item of scale 1e-3 is not held to the 1e3 item's
        alone = bound(item.q, item.k, item.v, item.mask)
        allowed = relation_allowed(bound, item)
        if bound.conventions.beyond:  # its own rounding, measured on each side: alone, and in the batch
            allowed = max(allowed, relation_allowed(bound, ex, item=b))
        measures.append(close(alone, out[b:b + 1], allowed,
                              f"item {b} (scale {ex.scales[b]:g}) computed alone vs in the batch"))
    return worst(*measures)


def _item(ex: AttnExample, b: int) -> AttnExample:
    """Item b of the example as an example of batch 1 (its mask in the shape it was drawn in)."""
    return ex._replace(sizes=ex.sizes._replace(batch=1), q=ex.q[b:b + 1], k=ex.k[b:b + 1], v=ex.v[b:b + 1],
                       mask=_item_mask(ex.mask, b), scales=(ex.scales[b],))
