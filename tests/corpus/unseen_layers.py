"""Attention layers written the ways popular libraries write them, kept out of the harness's development:
recognition is measured on them, never tuned to them.

Every class is a correct softmax multi-head attention (scores = q k^T * head_dim**-0.5, softmax over the
keys, a weighted sum of the values, heads concatenated, an output projection); each is written in the
idiom of a different library. The twins in ``unseen_twins`` break each one in a single place.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn


class EinopsFused(nn.Module):
    """lucidrains (vit-pytorch) style self-attention: one fused bias-free qkv projection, einops head split.

    forward(x, mask=None): x (B, N, dim); mask (B, N) bool, True = keep (key padding).
    """

    def __init__(self, dim: int = 64, heads: int = 4, dim_head: int = 16, dropout: float = 0.0):
        super().__init__()
        inner_dim = dim_head * heads
        self.heads = heads
        self.scale = dim_head**-0.5

        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)

        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))

    def forward(self, x, mask=None):
        qkv = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.heads), qkv)

        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale

        if mask is not None:
            mask = rearrange(mask, "b j -> b 1 1 j")
            dots = dots.masked_fill(~mask, -torch.finfo(dots.dtype).max)

        attn = self.attend(dots)
        attn = self.dropout(attn)

        out = torch.matmul(attn, v)
        out = rearrange(out, "b h n d -> b n (h d)")
        return self.to_out(out)


class EinopsCross(nn.Module):
    """perceiver-pytorch style (cross-)attention: separate q and fused kv projections, heads folded into batch.

    forward(x, context=None, mask=None): x (B, Lq, query_dim); context (B, Lk, context_dim), defaults to x;
    mask (B, Lk) bool, True = keep. context_dim=0 means context_dim = query_dim.
    """

    def __init__(
        self, query_dim: int = 64, context_dim: int = 0, heads: int = 4, dim_head: int = 16, dropout: float = 0.0
    ):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = context_dim or query_dim

        self.scale = dim_head**-0.5
        self.heads = heads

        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_kv = nn.Linear(context_dim, inner_dim * 2, bias=False)
        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.to_out = nn.Linear(inner_dim, query_dim)

    def forward(self, x, context=None, mask=None):
        h = self.heads

        q = self.to_q(x)
        context = x if context is None else context
        k, v = self.to_kv(context).chunk(2, dim=-1)

        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> (b h) n d", h=h), (q, k, v))

        sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale

        if mask is not None:
            mask = rearrange(mask, "b ... -> b (...)")
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = repeat(mask, "b j -> (b h) () j", h=h)
            sim = sim.masked_fill(~mask, max_neg_value)

        attn = self.attend(sim)
        attn = self.dropout(attn)

        out = torch.einsum("b i j, b j d -> b i d", attn, v)
        out = rearrange(out, "(b h) n d -> b n (h d)", h=h)
        return self.to_out(out)


class SeqFirst(nn.Module):
    """fairseq style attention on time-first tensors, heads folded into the batch axis.

    forward(query, key, value, key_padding_mask=None): query (T, B, C), key/value (S, B, C);
    key_padding_mask (B, S) bool, True = padded (gets no weight).
    """

    def __init__(self, embed_dim: int = 64, num_heads: int = 4, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        assert self.head_dim * num_heads == embed_dim, "embed_dim must be divisible by num_heads"
        self.scaling = self.head_dim**-0.5
        self.dropout_module = nn.Dropout(dropout)

        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

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
            # rows of attn_weights are ordered (batch, head): item b's mask repeats over its heads
            key_padding_mask = key_padding_mask.to(torch.bool).repeat_interleave(self.num_heads, dim=0)
            attn_weights = attn_weights.masked_fill(key_padding_mask.unsqueeze(1), float("-inf"))

        attn_weights = F.softmax(attn_weights, dim=-1)
        attn_probs = self.dropout_module(attn_weights)

        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn)


class InProjBiasKV(nn.Module):
    """torch.nn.MultiheadAttention-like, batch-first, written out: packed in_proj_weight, optional bias_k/bias_v.

    forward(query, key, value, attn_mask=None): query (B, Lq, E), key/value (B, Lk, E); attn_mask (Lq, Lk),
    either additive float or bool with True = NOT allowed (torch's MHA polarity). With add_bias_kv the learned
    bias_k/bias_v are appended as one extra key/value position that every query may attend.
    """

    def __init__(
        self,
        embed_dim: int = 64,
        num_heads: int = 4,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
    ):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.head_dim = embed_dim // num_heads
        assert self.head_dim * num_heads == embed_dim, "embed_dim must be divisible by num_heads"

        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim))
            self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim))
        else:
            self.bias_k = self.bias_v = None

        self._reset_parameters()

    def _reset_parameters(self):
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            nn.init.xavier_normal_(self.bias_v)

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
            v = torch.cat([v, self.bias_v.repeat(bsz, 1, 1)], dim=1)
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


class ModuleListQKV(nn.Module):
    """Annotated-Transformer style: q, k, v projections in one ModuleList, zipped with their inputs.

    forward(x, attn_mask=None): x (B, L, d_model); attn_mask (B, Lq, Lk) bool, True = keep.
    """

    def __init__(self, d_model: int = 64, n_head: int = 4, dropout: float = 0.0):
        super().__init__()
        assert d_model % n_head == 0
        self.d_k = d_model // n_head
        self.h = n_head
        self.proj = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(p=dropout)

    def attention(self, query, key, value, mask=None):
        d_k = query.size(-1)
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
        p_attn = scores.softmax(dim=-1)
        p_attn = self.dropout(p_attn)
        return torch.matmul(p_attn, value)

    def forward(self, x, attn_mask=None):
        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(1)  # the same mask for every head
        nbatches = x.size(0)

        query, key, value = [
            lin(t).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin, t in zip(self.proj, (x, x, x), strict=True)
        ]

        x = self.attention(query, key, value, mask=attn_mask)

        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.out(x)


class LengthsMasked(nn.Module):
    """llama style projections (wq, wk, wv, wo, no bias), key padding given as per-item valid lengths.

    forward(x, lengths=None): x (B, L, dim); lengths (B,) long, keys at positions >= lengths[b] get no weight.
    """

    def __init__(self, dim: int = 64, n_heads: int = 4, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, x, lengths=None):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)

        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = xk.view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xv = xv.view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)

        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        if lengths is not None:
            positions = torch.arange(seqlen, device=x.device)
            key_valid = positions[None, :] < lengths.to(x.device)[:, None]  # (bsz, seqlen)
            scores = scores.masked_fill(~key_valid[:, None, None, :], float("-inf"))
        scores = F.softmax(scores, dim=-1)
        scores = self.attn_dropout(scores)

        output = torch.matmul(scores, xv)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class WhisperStyle(nn.Module):
    """openai/whisper style: bias-free key projection, scale split as head_dim**-0.25 on both q and k.

    forward(x, xa=None, mask=None): x (B, Lq, n_state); xa (B, Lk, n_state) for cross-attention, keys and
    values come from it when given; mask additive float (L, L), 0 or -inf, added as mask[:Lq, :Lk].
    """

    def __init__(self, n_state: int = 64, n_head: int = 4):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def forward(self, x, xa=None, mask=None):
        q = self.query(x)
        k = self.key(x if xa is None else xa)
        v = self.value(x if xa is None else xa)
        wv = self.qkv_attention(q, k, v, mask)
        return self.out(wv)

    def qkv_attention(self, q, k, v, mask=None):
        _, n_ctx, n_state = q.shape
        scale = (n_state // self.n_head) ** -0.25
        q = q.view(*q.shape[:2], self.n_head, -1).permute(0, 2, 1, 3) * scale
        k = k.view(*k.shape[:2], self.n_head, -1).permute(0, 2, 3, 1) * scale
        v = v.view(*v.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)

        qk = q @ k
        if mask is not None:
            qk = qk + mask[:n_ctx, : k.shape[-1]]

        w = F.softmax(qk, dim=-1)
        return (w @ v).permute(0, 2, 1, 3).flatten(start_dim=2)


class HeadsLastSplit(nn.Module):
    """Hugging Face (BERT/DeBERTa) style: transpose_for_scores head split, einsum scores, extended additive mask.

    forward(hidden, attention_mask=None): hidden (B, L, hidden_size); attention_mask additive float
    (B, 1, 1, Lk), 0 for keys to keep and a large negative number for padding.
    """

    def __init__(self, hidden_size: int = 64, num_attention_heads: int = 4, attention_probs_dropout_prob: float = 0.0):
        super().__init__()
        if hidden_size % num_attention_heads != 0:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_attention_heads")
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = hidden_size // num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size

        self.query_proj = nn.Linear(hidden_size, self.all_head_size)
        self.key_proj = nn.Linear(hidden_size, self.all_head_size)
        self.value_proj = nn.Linear(hidden_size, self.all_head_size)
        self.output = nn.Linear(self.all_head_size, hidden_size)
        self.dropout = nn.Dropout(attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        B, L, _ = x.shape
        return x.view(B, L, self.num_attention_heads, self.attention_head_size).permute(0, 2, 1, 3)

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

        context_layer = torch.einsum("bhij,bhjd->bihd", attention_probs, value_layer)
        context_layer = context_layer.reshape(*context_layer.shape[:2], self.all_head_size)
        return self.output(context_layer)


class SdpaSelf(nn.Module):
    """MPT / timm style: fused Wqkv split by view+permute, the math left to F.scaled_dot_product_attention.

    forward(x, attn_mask=None): x (B, L, d_model); attn_mask bool broadcastable to (B, H, L, L), True = keep
    (scaled_dot_product_attention's own polarity).
    """

    def __init__(self, d_model: int = 64, n_heads: int = 4, attn_pdrop: float = 0.0, bias: bool = True):
        super().__init__()
        assert d_model % n_heads == 0
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.attn_pdrop = attn_pdrop
        self.Wqkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, attn_mask=None):
        B, L, C = x.shape
        qkv = self.Wqkv(x).view(B, L, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.attn_pdrop if self.training else 0.0
        )
        y = y.transpose(1, 2).reshape(B, L, C)
        return self.out_proj(y)


class CausalDecoder(nn.Module):
    """nanoGPT style causal self-attention with its own registered lower-triangular buffer named ``bias``.

    forward(x): x (B, T, n_embd) with T <= max_len; position t attends to positions 0..t.
    """

    def __init__(self, n_embd: int = 64, n_head: int = 4, max_len: int = 128, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        assert n_embd % n_head == 0
        self.qkv_linear = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head = n_head
        self.n_embd = n_embd
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def forward(self, x):
        B, T, C = x.size()

        q, k, v = self.qkv_linear(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)

        return self.resid_dropout(self.proj(y))
