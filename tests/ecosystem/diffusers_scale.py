"""diffusers' ``Attention(scale_qk=False)`` (scores q k^T, no 1/sqrt(dim_head)) with its default
processor, and with ``AttnProcessor2_0`` set on it, which calls SDPA without ``scale=``: the
finding of ``test_findings.py``, as targets for the gate (``library:Class`` of this file)."""

from __future__ import annotations

from diffusers.models.attention_processor import Attention, AttnProcessor2_0


class UnscaledAttention(Attention):
    def __init__(self, query_dim: int, heads: int) -> None:
        super().__init__(query_dim=query_dim, heads=heads, dim_head=query_dim // heads, scale_qk=False)


class UnscaledAttentionFusedProcessor(UnscaledAttention):
    def __init__(self, query_dim: int, heads: int) -> None:
        super().__init__(query_dim, heads)
        self.set_processor(AttnProcessor2_0())
