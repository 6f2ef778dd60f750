"""A catalog of one-bug variants of the reference: the mistakes people really make.

Each mutant subclasses mha.MultiHeadAttention and changes one thing on the path that
``forward(q, k, v, mask)`` takes (the fast path). ``CATALOG`` maps a mutant's name to
(class, the property expected to catch it). tests/test_mutants.py checks that `check` fails
each with that property.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mha_verify.mha import MultiHeadAttention
from mha_verify.mha.masks import keep_mask


def _bool_keep(mask: torch.Tensor | None) -> torch.Tensor | None:
    return keep_mask(mask)


_NO_WEIGHTS = {"mask": ("bool", "float"), "weights": False}  # forward ignores need_weights


class _Explicit(MultiHeadAttention):
    """The reference with its fast path replaced by an explicit formula that mutants bend."""

    def scores(self, qh: torch.Tensor, kh: torch.Tensor) -> torch.Tensor:
        return torch.matmul(qh * self.scale, kh.transpose(-2, -1))  # (B, H, Lq, Lk), scaled first (float16)

    def masked(self, score: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            return score
        if mask.dtype == torch.bool:
            return score.masked_fill(~mask, float("-inf"))
        return score + mask

    def normalize(self, score: torch.Tensor) -> torch.Tensor:
        has_key = score.amax(dim=-1, keepdim=True) > float("-inf")
        return torch.softmax(score.masked_fill(~has_key, 0.0), dim=-1).masked_fill(~has_key, 0.0)

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        weights = self.dropout(self.normalize(self.masked(self.scores(qh, kh), mask)))
        return torch.matmul(weights, vh)


class ConcatWithoutTranspose(MultiHeadAttention):
    """(B, H, Lq, Hd) reshaped straight to (B, Lq, D): heads and positions scrambled."""

    mha_verify_conventions = _NO_WEIGHTS

    def forward(self, q, k, v, mask=None, *, need_weights=False):  # type: ignore[no-untyped-def]
        B, Lq = q.shape[0], q.shape[1]
        qh = self.w_q(q).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        kh = self.w_k(k).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        vh = self.w_v(v).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        heads = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        return self.w_o(heads.reshape(B, Lq, self.d_model))


class WrongSplit(MultiHeadAttention):
    """Features split as (Hd, H) instead of (H, Hd): head i gets every H-th feature."""

    mha_verify_conventions = _NO_WEIGHTS

    def forward(self, q, k, v, mask=None, *, need_weights=False):  # type: ignore[no-untyped-def]
        def split(x: torch.Tensor) -> torch.Tensor:
            return x.unflatten(-1, (self.head_dim, self.n_head)).transpose(-1, -2).transpose(1, 2)

        heads = F.scaled_dot_product_attention(split(self.w_q(q)), split(self.w_k(k)), split(self.w_v(v)),
                                               attn_mask=mask)
        return self.w_o(heads.transpose(1, 2).flatten(-2))


class ScaleBySqrtDModel(_Explicit):
    """Scores divided by sqrt(d_model) instead of sqrt(head_dim)."""

    def scores(self, qh: torch.Tensor, kh: torch.Tensor) -> torch.Tensor:
        return torch.matmul(qh, kh.transpose(-2, -1)) / math.sqrt(self.d_model)


class SoftmaxOverQueries(_Explicit):
    """Softmax over the query axis (dim=-2) instead of the key axis."""

    def normalize(self, score: torch.Tensor) -> torch.Tensor:
        return torch.softmax(score, dim=-2).nan_to_num(0.0)


class MaskPolarityInverted(_Explicit):
    """torch.nn.MultiheadAttention's convention (True = not allowed) applied to our masks."""

    def masked(self, score: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        keep = _bool_keep(mask)
        return score if keep is None else score.masked_fill(keep, float("-inf"))


class ScoresInFloat16(_Explicit):
    """Scores computed in float16 and cast back: wrong by ~1e-3, inside a guessed 1e-3 tolerance."""

    def scores(self, qh: torch.Tensor, kh: torch.Tensor) -> torch.Tensor:
        return (torch.matmul(qh.half(), kh.half().transpose(-2, -1)) * self.scale).to(qh.dtype)


class SoftmaxInFloat16(_Explicit):
    """softmax taken in float16 and cast back ("downcast to save memory"): for float32 inputs the
    weights keep float16's 1e-3, a defect in the dtype the layer works in. Twin of SoftmaxInFloat32."""

    def normalize(self, score: torch.Tensor) -> torch.Tensor:
        has_key = score.amax(dim=-1, keepdim=True) > float("-inf")
        weights = torch.softmax(score.masked_fill(~has_key, 0.0), dim=-1, dtype=torch.float16).to(score.dtype)
        return weights.masked_fill(~has_key, 0.0)


class SoftmaxInFloat32(_Explicit):
    """softmax taken in float32 and cast back (HF's "upcast attention to fp32"): exact for float32
    inputs and below; float64 inputs are computed at float32 precision there. Not a mutant: a
    precision policy, which the gate must report as one and not fail (tests/test_precision.py)."""

    def normalize(self, score: torch.Tensor) -> torch.Tensor:
        has_key = score.amax(dim=-1, keepdim=True) > float("-inf")
        weights = torch.softmax(score.masked_fill(~has_key, 0.0), dim=-1, dtype=torch.float32).to(score.dtype)
        return weights.masked_fill(~has_key, 0.0)


class NoMaxSubtraction(_Explicit):
    """softmax as exp(s) / sum(exp(s)): overflows to inf/inf = NaN for scores above ~88."""

    def normalize(self, score: torch.Tensor) -> torch.Tensor:
        e = torch.exp(score)
        return e / e.sum(dim=-1, keepdim=True).clamp_min(1e-30)


class KeysFromValues(MultiHeadAttention):
    """Keys projected from v (what the dynamo exporter's input aliasing does; and a typo)."""

    def forward(self, q, k, v, mask=None, *, need_weights=False):  # type: ignore[no-untyped-def]
        return super().forward(q, v, v, mask, need_weights=need_weights)


class NaNOnFullyMaskedRows(_Explicit):
    """Seed 000's masked_fill(-inf) + softmax: NaN where a row has no key."""

    def normalize(self, score: torch.Tensor) -> torch.Tensor:
        return torch.softmax(score, dim=-1)


class MaskWithMinusOneE9(_Explicit):
    """masked_fill(-1e9) (seed 001's tip): a fully masked row attends uniformly to masked keys."""

    def masked(self, score: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        keep = _bool_keep(mask)
        return score if keep is None else score.masked_fill(~keep, -1e9)


class DropoutInEval(_Explicit):
    """F.dropout(training=True) hard-coded: dropout also in eval mode."""

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        weights = F.dropout(self.normalize(self.masked(self.scores(qh, kh), mask)), self.dropout.p, training=True)
        return torch.matmul(weights, vh)


class KVCacheCarriesState(MultiHeadAttention):
    """Caches the projected keys of the first call and reuses them when shapes match."""

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.1) -> None:
        super().__init__(d_model, n_head, dropout)
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def forward(self, q, k, v, mask=None, *, need_weights=False):  # type: ignore[no-untyped-def]
        k = self._cache.setdefault(tuple(k.shape), k.detach())
        return super().forward(q, k, v, mask, need_weights=need_weights)


class MaxOverWholeBatch(_Explicit):
    """The softmax's max-subtraction takes the maximum over the whole tensor, not per row:
    an item of small scale next to one of large scale underflows to 0 / 0."""

    def normalize(self, score: torch.Tensor) -> torch.Tensor:
        has_key = score.amax(dim=-1, keepdim=True) > float("-inf")
        e = torch.exp(score - score.masked_fill(~has_key, 0.0).amax())
        return (e / e.sum(dim=-1, keepdim=True)).masked_fill(~has_key, 0.0)


class ValuesDetached(_Explicit):
    """v's projection detached: no gradient reaches w_v or v."""

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        return super()._fast_attention(qh, kh, vh.detach(), mask)


class FullyMaskedRowsZeroedAfterProjection(MultiHeadAttention):
    """Fully masked rows zeroed after w_o (output 0) instead of before (output b_o)."""

    mha_verify_conventions = _NO_WEIGHTS

    def forward(self, q, k, v, mask=None, *, need_weights=False):  # type: ignore[no-untyped-def]
        out = super().forward(q, k, v, mask)
        if mask is None:
            return out
        keep = _bool_keep(mask).expand(q.shape[0], self.n_head, q.shape[1], k.shape[1])  # type: ignore[union-attr]
        return out * keep.any(dim=-1).all(dim=1, keepdim=False).unsqueeze(-1)


class FirstHeadMaskOnly(_Explicit):
    """A (B, H, Lq, Lk) mask reduced to its first head's (B, 1, Lq, Lk) slice."""

    def masked(self, score: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is not None and mask.dim() == 4:
            mask = mask[:, :1]
        return super().masked(score, mask)


class TruncatesLongerValues(MultiHeadAttention):
    """v cut to k's length instead of rejecting Lk != Lv."""

    def forward(self, q, k, v, mask=None, *, need_weights=False):  # type: ignore[no-untyped-def]
        return super().forward(q, k, v[:, : k.shape[1]], mask, need_weights=need_weights)


class WeightsIgnoreMask(MultiHeadAttention):
    """The returned weights computed without the mask (the output is right)."""

    def _math_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        heads, _ = super()._math_attention(qh, kh, vh, mask)
        _, weights = super()._math_attention(qh, kh, vh, None)
        return heads, weights


class DropsLastKey(_Explicit):
    """An off-by-one: the last key never attended to."""

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        if kh.shape[-2] > 1:
            kh, vh = kh[..., :-1, :], vh[..., :-1, :]
            if mask is not None and mask.shape[-1] > 1:
                mask = mask[..., :-1]
        return super()._fast_attention(qh, kh, vh, mask)


# --- bugs of tiled kernels and chunked loops: exact below a block boundary, wrong past it ---------

KEY_BLOCK, QUERY_TILE, HEAD_CHUNK, BATCH_CHUNK, HEAD_DIM_CAP = 32, 16, 4, 4, 64


class OnlineSoftmaxNoRescale(_Explicit):
    """Flash-style online softmax over key blocks of 32 that forgets to rescale the running sum
    and output of earlier blocks by exp(m_old - m_new): exact while Lk <= 32."""

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        score = self.masked(self.scores(qh, kh), mask)  # (B, H, Lq, Lk)
        m = torch.full((*score.shape[:-1], 1), float("-inf"), dtype=score.dtype)
        total = torch.zeros_like(m)
        acc = torch.zeros(*score.shape[:-1], vh.shape[-1], dtype=score.dtype)
        for j in range(0, score.shape[-1], KEY_BLOCK):
            s = score[..., j:j + KEY_BLOCK]
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            safe = torch.where(m_new > float("-inf"), m_new, torch.zeros_like(m_new))
            p = torch.exp(s - safe)
            total = total + p.sum(dim=-1, keepdim=True)  # BUG: total * exp(m - m_new) forgotten
            acc = acc + p @ vh[..., j:j + KEY_BLOCK, :]  # BUG: acc * exp(m - m_new) forgotten
            m = m_new
        return torch.where(total > 0, acc / total.clamp_min(1e-30), torch.zeros_like(acc))


class QueryTileRemainder(_Explicit):
    """Queries in tiles of 16; a partial last tile after the first forgets the 1/sqrt(Hd) scale."""

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        lq = qh.shape[-2]
        full = None if mask is None else mask.expand(*qh.shape[:-2], lq, kh.shape[-2])
        out = []
        for i in range(0, lq, QUERY_TILE):
            tile = qh[..., i:i + QUERY_TILE, :]
            score = torch.matmul(tile, kh.transpose(-2, -1))
            if not (i > 0 and tile.shape[-2] < QUERY_TILE):  # BUG: the remainder tile is not scaled
                score = score * self.scale
            m = None if full is None else full[..., i:i + QUERY_TILE, :]
            out.append(torch.matmul(self.normalize(self.masked(score, m)), vh))
        return torch.cat(out, dim=-2)


class HeadChunksReuseFirstKeys(_Explicit):
    """Heads processed in chunks of 4; later chunks read the keys of the first chunk."""

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        out = []
        for c in range(0, qh.shape[1], HEAD_CHUNK):
            n = qh[:, c:c + HEAD_CHUNK].shape[1]
            m = mask if mask is None or mask.dim() < 3 or mask.shape[-3] == 1 else mask[..., c:c + n, :, :]
            k = kh[:, :n]  # BUG: should be kh[:, c:c + n]
            out.append(super()._fast_attention(qh[:, c:c + n], k, vh[:, c:c + n], m))
        return torch.cat(out, dim=1)


class BatchChunksReuseFirstKeys(_Explicit):
    """Batch items processed in chunks of 4; later chunks read the keys of the first chunk."""

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        out = []
        for c in range(0, qh.shape[0], BATCH_CHUNK):
            n = qh[c:c + BATCH_CHUNK].shape[0]
            m = mask if mask is None or mask.dim() < 4 or mask.shape[0] == 1 else mask[c:c + n]
            out.append(super()._fast_attention(qh[c:c + n], kh[:n], vh[c:c + n], m))  # BUG: kh[c:c + n]
        return torch.cat(out, dim=0)


class HeadDimCappedScale(_Explicit):
    """The scale read from a config that caps the head width at 64: 1/sqrt(min(Hd, 64))."""

    def scores(self, qh: torch.Tensor, kh: torch.Tensor) -> torch.Tensor:
        return torch.matmul(qh, kh.transpose(-2, -1)) / math.sqrt(min(self.head_dim, HEAD_DIM_CAP))


class ReversedHeads(MultiHeadAttention):
    """Heads concatenated in reverse order before w_o: every head's output lands in another's columns."""

    mha_verify_conventions = _NO_WEIGHTS

    def forward(self, q, k, v, mask=None, *, need_weights=False):  # type: ignore[no-untyped-def]
        qh = self.w_q(q).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        kh = self.w_k(k).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        vh = self.w_v(v).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        heads = self._fast_attention(qh, kh, vh, mask).flip(1)  # BUG: (B, H, Lq, Hd) heads reversed
        return self.w_o(heads.transpose(1, 2).flatten(-2))


# --- bugs where real kernels break: backward, strides, dtypes, half-precision range, padding ------


class _BackwardPastFirstBlock(torch.autograd.Function):
    """Attention with an exact forward and a flash-style backward whose row term D = rowsum(dO * O)
    is accumulated over the first key block only: exact while Lk <= 32."""

    @staticmethod
    def forward(ctx, qh, kh, vh, mask, scale):  # type: ignore[no-untyped-def,override]
        score = torch.matmul(qh * scale, kh.transpose(-2, -1))
        if mask is not None:
            score = score.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else score + mask
        has_key = score.amax(dim=-1, keepdim=True) > float("-inf")
        p = torch.softmax(score.masked_fill(~has_key, 0.0), dim=-1).masked_fill(~has_key, 0.0)
        ctx.save_for_backward(qh, kh, vh, p)
        ctx.scale = scale
        return torch.matmul(p, vh)

    @staticmethod
    def backward(ctx, d_out):  # type: ignore[no-untyped-def,override]
        qh, kh, vh, p = ctx.saved_tensors
        d_p = torch.matmul(d_out, vh.transpose(-2, -1))  # (B, H, Lq, Lk)
        row = (p[..., :KEY_BLOCK] * d_p[..., :KEY_BLOCK]).sum(-1, keepdim=True)  # BUG: over every key
        d_s = p * (d_p - row)
        return (torch.matmul(d_s, kh) * ctx.scale, torch.matmul(d_s.transpose(-2, -1), qh) * ctx.scale,
                torch.matmul(p.transpose(-2, -1), d_out), None, None)


class BackwardPastFirstKeyBlock(_Explicit):
    """A custom autograd kernel: forward exact at every size, backward wrong past the first key block."""

    def _fast_attention(self, qh, kh, vh, mask):  # type: ignore[no-untyped-def]
        return _BackwardPastFirstBlock.apply(qh, kh, vh, mask, self.scale)


def _dense(x: torch.Tensor) -> torch.Tensor:
    """x's storage read from its offset as if x were contiguous: what a kernel that takes a raw
    data pointer and never calls .contiguous() sees."""
    strides = [1] * x.dim()
    for i in range(x.dim() - 2, -1, -1):
        strides[i] = strides[i + 1] * x.shape[i + 1]
    return torch.as_strided(x, x.shape, strides, x.storage_offset())


class IgnoresStrides(MultiHeadAttention):
    """Reads q, k and v as dense from their data pointers: exact on contiguous tensors, wrong on views."""

    def forward(self, q, k, v, mask=None, need_weights=False):  # type: ignore[no-untyped-def]
        return super().forward(_dense(q), _dense(k), _dense(v), mask, need_weights=need_weights)


class ReturnsFloat64(MultiHeadAttention):
    """Returns its output in float64 whatever the inputs' dtype (an upcast never cast back): the
    values are right, the dtype is not."""

    def forward(self, q, k, v, mask=None, need_weights=False):  # type: ignore[no-untyped-def]
        out = super().forward(q, k, v, mask, need_weights=need_weights)
        return tuple(t.double() for t in out) if need_weights else out.double()


class ScalesQueryInPlace(MultiHeadAttention):
    """Scales q in place (q.mul_) before its projection and undoes it on the projection: the output
    is right, but the caller's q is left scaled."""

    def forward(self, q, k, v, mask=None, need_weights=False):  # type: ignore[no-untyped-def]
        if q is k or q is v:  # the scaled q would feed the keys too: keep the output exact
            return super().forward(q, k, v, mask, need_weights=need_weights)
        with torch.no_grad():
            q.mul_(2.0)  # BUG: the caller's tensor
        return super().forward(q * 0.5, k, v, mask, need_weights=need_weights)


class UnscaledScoresInHalf(_Explicit):
    """Scores as (q k^T) * scale in the input dtype: exact in float32; in float16 the product
    overflows 65504 before the scale brings it back (inputs of magnitude ~100, Hd >= 64)."""

    def scores(self, qh: torch.Tensor, kh: torch.Tensor) -> torch.Tensor:
        return torch.matmul(qh, kh.transpose(-2, -1)) * self.scale


class AssumesRightPadding(_Explicit):
    """A key-padding mask (B, 1, 1, Lk) turned into lengths (mask.sum) and rebuilt as right padding:
    exact for right-padded batches, wrong for left padding and holes."""

    def masked(self, score: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is not None and mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1:3] == (1, 1):
            lengths = mask.sum(-1, keepdim=True)  # (B, 1, 1, 1)
            mask = torch.arange(mask.shape[-1]) < lengths  # BUG: assumes the kept keys come first
        return super().masked(score, mask)


# name -> (class, property that catches it, dtype it runs in, trigger): the kernel-depth mutants,
# each exact in its plain condition (tests/test_kernel_mutants.py proves both sides)
KERNEL_MUTANTS: dict[str, tuple[type[MultiHeadAttention], str, torch.dtype, str]] = {
    "backward_past_first_key_block": (BackwardPastFirstKeyBlock, "grad_agreement", torch.float32, "Lk > 32"),
    "ignores_strides": (IgnoresStrides, "layout_independence", torch.float32, "non-contiguous inputs"),
    "returns_float64": (ReturnsFloat64, "oracle_agreement", torch.float32, "any call"),
    "scales_query_in_place": (ScalesQueryInPlace, "oracle_agreement", torch.float32, "any call"),
    "unscaled_scores_in_half": (UnscaledScoresInHalf, "finite_large_inputs", torch.float16,
                                "float16, magnitude 100, Hd >= 64"),
    "assumes_right_padding": (AssumesRightPadding, "oracle_agreement", torch.float32,
                              "a key-padding mask padded on the left or with holes"),
}


# name -> (class, property expected to catch it); the boundary mutants also name the size
# below which they are exact (tests/test_mutants.py proves both sides)
BOUNDARY_MUTANTS: dict[str, tuple[type[MultiHeadAttention], dict[str, int]]] = {
    "online_softmax_no_rescale": (OnlineSoftmaxNoRescale, {"lk": KEY_BLOCK}),
    "query_tile_remainder": (QueryTileRemainder, {"lq": QUERY_TILE}),
    "head_chunks_reuse_first_keys": (HeadChunksReuseFirstKeys, {"n_head": HEAD_CHUNK}),
    "batch_chunks_reuse_first_keys": (BatchChunksReuseFirstKeys, {"batch": BATCH_CHUNK}),
    "head_dim_capped_scale": (HeadDimCappedScale, {"head_dim": HEAD_DIM_CAP}),
}

CATALOG: dict[str, tuple[type[MultiHeadAttention], str]] = {
    "online_softmax_no_rescale": (OnlineSoftmaxNoRescale, "oracle_agreement"),
    "query_tile_remainder": (QueryTileRemainder, "oracle_agreement"),
    "head_chunks_reuse_first_keys": (HeadChunksReuseFirstKeys, "head_split"),
    "batch_chunks_reuse_first_keys": (BatchChunksReuseFirstKeys, "batch_independence"),
    "head_dim_capped_scale": (HeadDimCappedScale, "oracle_agreement"),
    "reversed_heads": (ReversedHeads, "head_split"),
    "concat_without_transpose": (ConcatWithoutTranspose, "oracle_agreement"),
    "wrong_split": (WrongSplit, "head_split"),
    "scale_sqrt_d_model": (ScaleBySqrtDModel, "oracle_agreement"),
    "softmax_over_queries": (SoftmaxOverQueries, "oracle_agreement"),
    "mask_polarity_inverted": (MaskPolarityInverted, "masked_kv_invariance"),
    "weights_ignore_mask": (WeightsIgnoreMask, "mask_zeroes_weights"),
    "scores_in_float16": (ScoresInFloat16, "oracle_agreement"),
    "softmax_in_float16": (SoftmaxInFloat16, "oracle_agreement"),
    "no_max_subtraction": (NoMaxSubtraction, "finite_large_inputs"),
    "keys_from_values": (KeysFromValues, "oracle_agreement"),
    "nan_on_fully_masked_rows": (NaNOnFullyMaskedRows, "fully_masked_rows"),
    "mask_with_minus_1e9": (MaskWithMinusOneE9, "fully_masked_rows"),
    "dropout_in_eval": (DropoutInEval, "dropout_off_in_eval"),
    "kv_cache_carries_state": (KVCacheCarriesState, "determinism"),
    "max_over_whole_batch": (MaxOverWholeBatch, "batch_independence"),
    "values_detached": (ValuesDetached, "gradcheck"),
    "fully_masked_rows_zeroed_after_projection": (FullyMaskedRowsZeroedAfterProjection, "fully_masked_rows"),
    "first_head_mask_only": (FirstHeadMaskOnly, "oracle_agreement"),
    "truncates_longer_values": (TruncatesLongerValues, "lk_equals_lv"),
    "drops_last_key": (DropsLastKey, "key_permutation"),
}
