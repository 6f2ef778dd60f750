"""Broken twins of the layers in ``unseen_layers``: each ``<Name>Bug`` changes exactly one thing in ``<Name>``.

Each is a bug real attention code has shipped with; each twin's docstring names its bug in one sentence.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .unseen_layers import (
    CausalDecoder,
    EinopsCross,
    EinopsFused,
    HeadsLastSplit,
    InProjBiasKV,
    LengthsMasked,
    ModuleListQKV,
    SdpaSelf,
    SeqFirst,
    WhisperStyle,
)

__all__ = [
    "CausalDecoderBug",
    "EinopsCrossBug",
    "EinopsFusedBug",
    "HeadsLastSplitBug",
    "InProjBiasKVBug",
    "LengthsMaskedBug",
    "ModuleListQKVBug",
    "SdpaSelfBug",
    "SeqFirstBug",
    "WhisperStyleBug",
]


class EinopsFusedBug(EinopsFused):
    """Scores are scaled by 1/dim_head instead of 1/sqrt(dim_head)."""

    def __init__(self, dim: int = 64, heads: int = 4, dim_head: int = 16, dropout: float = 0.0):
        super().__init__(dim=dim, heads=heads, dim_head=dim_head, dropout=dropout)
        self.scale = dim_head**-1.0


class EinopsCrossBug(EinopsCross):
    """The softmax normalises over the query axis (dim=-2) instead of the key axis."""

    def __init__(
        self, query_dim: int = 64, context_dim: int = 0, heads: int = 4, dim_head: int = 16, dropout: float = 0.0
    ):
        super().__init__(query_dim=query_dim, context_dim=context_dim, heads=heads, dim_head=dim_head, dropout=dropout)
        self.attend = nn.Softmax(dim=-2)


class SeqFirstBug(SeqFirst):
    """key_padding_mask is tiled over the (batch, head) rows with repeat instead of repeat_interleave, so most
    heads get another item's padding mask."""

    def forward(self, query, key, value, key_padding_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        src_len = key.size(0)

        q = self.q_proj(query)
        k = self.k_proj(key)
        v = self.v_proj(value)
        q = q * self.scaling

        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)

        attn_weights = torch.bmm(q, k.transpose(1, 2))
        assert list(attn_weights.size()) == [bsz * self.num_heads, tgt_len, src_len]

        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.to(torch.bool).repeat(self.num_heads, 1)
            attn_weights = attn_weights.masked_fill(key_padding_mask.unsqueeze(1), float("-inf"))

        attn_weights = F.softmax(attn_weights, dim=-1)
        attn_probs = self.dropout_module(attn_weights)

        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn)


class InProjBiasKVBug(InProjBiasKV):
    """With add_bias_kv, bias_k is appended to the values as well as the keys, so bias_v is never used."""

    def forward(self, query, key, value, attn_mask=None):
        bsz, tgt_len, embed_dim = query.shape
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        else:
            b_q = b_k = b_v = None
        q = F.linear(query, w_q, b_q)
        k = F.linear(key, w_k, b_k)
        v = F.linear(value, w_v, b_v)

        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.repeat(bsz, 1, 1)], dim=1)
            v = torch.cat([v, self.bias_k.repeat(bsz, 1, 1)], dim=1)
            if attn_mask is not None:
                attn_mask = F.pad(attn_mask, (0, 1))

        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill_(attn_mask, float("-inf"))

        q = q.view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)

        q = q * (1.0 / math.sqrt(self.head_dim))
        attn_output_weights = torch.matmul(q, k.transpose(-2, -1))
        if attn_mask is not None:
            attn_output_weights = attn_output_weights + attn_mask
        attn_output_weights = F.softmax(attn_output_weights, dim=-1)
        attn_output_weights = F.dropout(attn_output_weights, p=self.dropout, training=self.training)

        attn_output = torch.matmul(attn_output_weights, v)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, tgt_len, embed_dim)
        return self.out_proj(attn_output)


class ModuleListQKVBug(ModuleListQKV):
    """Heads are merged by viewing (B, H, L, d_k) straight as (B, L, H*d_k), without the transpose back."""

    def forward(self, x, attn_mask=None):
        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(1)  # the same mask for every head
        nbatches = x.size(0)

        query, key, value = [
            lin(t).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin, t in zip(self.proj, (x, x, x), strict=True)
        ]

        x = self.attention(query, key, value, mask=attn_mask)

        x = x.contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.out(x)


class LengthsMaskedBug(LengthsMasked):
    """The length mask compares with <= instead of <, so the first padding key (position lengths[b]) gets weight."""

    def forward(self, x, lengths=None):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)

        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = xk.view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xv = xv.view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)

        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        if lengths is not None:
            positions = torch.arange(seqlen, device=x.device)
            key_valid = positions[None, :] <= lengths.to(x.device)[:, None]  # (bsz, seqlen)
            scores = scores.masked_fill(~key_valid[:, None, None, :], float("-inf"))
        scores = F.softmax(scores, dim=-1)
        scores = self.attn_dropout(scores)

        output = torch.matmul(scores, xv)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class WhisperStyleBug(WhisperStyle):
    """In cross-attention the values are projected from x instead of xa (the keys still come from xa)."""

    def forward(self, x, xa=None, mask=None):
        q = self.query(x)
        k = self.key(x if xa is None else xa)
        v = self.value(x)
        wv = self.qkv_attention(q, k, v, mask)
        return self.out(wv)


class HeadsLastSplitBug(HeadsLastSplit):
    """The context einsum writes 'bidh' instead of 'bihd', so the merge interleaves the heads' channels."""

    def forward(self, hidden, attention_mask=None):
        query_layer = self.transpose_for_scores(self.query_proj(hidden))
        key_layer = self.transpose_for_scores(self.key_proj(hidden))
        value_layer = self.transpose_for_scores(self.value_proj(hidden))

        attention_scores = torch.einsum("bhid,bhjd->bhij", query_layer, key_layer)
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask

        attention_probs = F.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)

        context_layer = torch.einsum("bhij,bhjd->bidh", attention_probs, value_layer)
        context_layer = context_layer.reshape(*context_layer.shape[:2], self.all_head_size)
        return self.output(context_layer)


class SdpaSelfBug(SdpaSelf):
    """The bool keep-mask is turned into an additive bias with nn.MultiheadAttention's polarity (True = masked),
    so the kept keys are the ones blocked."""

    def forward(self, x, attn_mask=None):
        B, L, C = x.shape
        qkv = self.Wqkv(x).view(B, L, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if attn_mask is not None:
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                attn_mask, float("-inf")
            )
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.attn_pdrop if self.training else 0.0
        )
        y = y.transpose(1, 2).reshape(B, L, C)
        return self.out_proj(y)


class CausalDecoderBug(CausalDecoder):
    """The causal buffer is built with tril(diagonal=-1), so no position may attend to itself."""

    def __init__(self, n_embd: int = 64, n_head: int = 4, max_len: int = 128, dropout: float = 0.0, bias: bool = True):
        super().__init__(n_embd=n_embd, n_head=n_head, max_len=max_len, dropout=dropout, bias=bias)
        self.bias = torch.tril(torch.ones(max_len, max_len), diagonal=-1).view(1, 1, max_len, max_len)
