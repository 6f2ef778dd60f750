"""Decoding through a KV cache: prefill and decode steps compute what one forward over every position does.

Every causal language model serves through a cache: the positions of a sequence arrive in chunks (a
prefill of P positions, then one per step, or chunks of C), each chunk's queries attending to the keys
and values the cache holds plus its own, the causal mask aligned bottom-right (query i of a chunk
starting at s sees keys j <= s + i). A layer whose cache is written one slot off, whose positions
restart or shift with the cache, or whose chunk mask is aligned top-left computes something else
than its own forward over the whole sequence, and only this relation sees it: a forward without a
cache never reads one.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import strategies as st

from mha_verify.properties.engine.applicable import examples_for
from mha_verify.properties.engine.measure import UNCHECKED, Measure, Violation, relation_allowed, worst
from mha_verify.properties.engine.registry import invariant
from mha_verify.properties.protocol import Conventions, Instance
from mha_verify.properties.strategies.examples import AttnExample
from mha_verify.properties.strategies.size_cases import sizes

#: the longest sequence decoded: past the 16, 32 and 64 block boundaries, at one layer call per step
MAX_DECODED = 70


def chunks_of(length: int, prefill: int, step: int) -> tuple[int, ...]:
    """Chunk sizes covering ``length`` positions: ``prefill`` first, then chunks of ``step`` (the last one
    shorter where ``step`` does not divide the rest); ValueError for sizes that cover nothing."""
    if not 1 <= prefill <= length or step < 1:
        raise ValueError(f"chunks_of needs 1 <= prefill <= length and step >= 1, got length={length}, "
                         f"prefill={prefill}, step={step}")
    rest = length - prefill
    return (prefill, *(min(step, rest - i) for i in range(0, rest, step)))


def schedules(length: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, chunk sizes) for a sequence of ``length`` positions: a prefill of half the sequence then
    decode steps of one, and one position then chunks of three (a chunked prefill: Lq = 3 against
    Lk = 4, 7, ...)."""
    out = [("prefill then decode steps", chunks_of(length, max(1, (length + 1) // 2), 1))]
    if length > 2:
        out.append(("chunks of 3", chunks_of(length, 1, 3)))
    return out


def _cached_examples(conv: Conventions) -> st.SearchStrategy[AttnExample] | str:
    if conv.kv_cache is None:
        return "the target takes no KV cache the harness can drive (a transformers Cache with a layer_idx)"
    if not conv.causal:
        return "the target is not causal: its cache is not one that decoding fills position by position"
    self_only = dataclasses.replace(conv, cross_attention=False, kv_shared=False)
    return examples_for(self_only, kinds=("none",), shapes=sizes(max_len=MAX_DECODED, min_len=2, fixed=conv.sizes),
                        layouts=False)


@invariant("decode_consistency", strategy=_cached_examples)
def decode_consistency(bound: Instance, ex: AttnExample) -> Measure:
    """Prefill plus decode through the layer's own KV cache equals one forward over all positions.

    For x (B, L, D) and chunk sizes c_1 .. c_n summing to L, each chunk run with the cache the earlier
    ones filled (its causal mask aligned bottom-right over every cached key, its positions where the
    chunk starts): concat(out_1 .. out_n) = layer(x) within twice the derived tolerance. Two
    schedules: a prefill of half the sequence then decode steps of one, and chunks of three. The
    report names the first position that differs and the chunk it was in.
    """
    x = ex.q
    full = bound(x, x, x, None).detach()
    allowed = relation_allowed(bound, ex)
    measures = []
    for name, chunks in schedules(x.shape[1]):
        got = bound.cached(x, chunks).detach()
        diff = (got.double() - full.double()).abs().nan_to_num(float("inf")).amax(dim=(0, 2))  # (L,)
        bad = torch.nonzero(diff > allowed)
        if bad.numel():
            at = int(bad[0])
            ends = torch.tensor(chunks).cumsum(0)
            chunk = int((ends <= at).sum())
            start = int(ends[chunk - 1]) if chunk else 0
            raise Violation(
                f"{name} {list(chunks)}: position {at} (chunk {chunk + 1}: Lq={chunks[chunk]} against Lk="
                f"{start + chunks[chunk]} keys, {start} of them cached) differs from the forward over all "
                f"{x.shape[1]} positions by {float(diff[at]):.3g} > allowed {allowed:.3g}; max over positions "
                f"{float(diff.max()):.3g}", float(diff.max()), allowed)
        measures.append(Measure(float(diff.max()), allowed) if math.isfinite(allowed) else UNCHECKED)
    return worst(*measures)
