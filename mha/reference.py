"""Pure reference formulas for multi-head attention, free of any module.

``attention`` is scaled dot-product attention written out plainly; evaluated in float64 it
is the oracle of the property suite, evaluated in the target's dtype it is the
"same-precision reference" whose error calibrates tolerances. ``multi_head`` is the packed
formulation (one D x D projection, then a split into heads) and ``per_head`` the paper's
(each head projects with its own slice W_i). Both follow the module's mask contract:
bool True = may attend, float = additive bias, fully masked rows get zero weights.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from typing import NamedTuple

import torch
import torch.nn.functional as F

from mha_verify.mha.masks import FULLY_MASKED, additive_mask, causal_keep
from mha_verify.mha.scoring import TEXTBOOK, Scoring


class MHAParams(NamedTuple):
    """The weights of a multi-head attention layer, in nn.Linear's (out, in) layout.

    w_q: (D, D); w_k, w_v: (Hkv * Hd, D), where Hkv = H for multi-head attention and
    Hkv < H for grouped-query (Hkv = 1: multi-query) attention; w_o: (D, D), or None for a
    layer without an output projection (BERT's self-attention). Biases: (out,) or None.
    """

    w_q: torch.Tensor
    b_q: torch.Tensor | None
    w_k: torch.Tensor
    b_k: torch.Tensor | None
    w_v: torch.Tensor
    b_v: torch.Tensor | None
    w_o: torch.Tensor | None
    b_o: torch.Tensor | None

    def to(self, dtype: torch.dtype) -> MHAParams:
        """All weights detached and converted to ``dtype`` (read-only: conversions are shared, see _converted)."""
        return MHAParams._make(None if t is None else _converted(t, dtype) for t in self)


# The oracle converts the same weights to float64 several times per example (the formula, the
# same-precision formula twice, the relations' allowances): 3 s of a ci gate. A conversion is
# reused while the tensor that owns the memory (the parameter itself, or the base of a view
# such as a slice of a fused qkv weight) is alive, so its memory cannot have been reused,
# and unmodified: torch bumps ``_version`` on every in-place change (head_split's
# restriction of W_o), for views and base alike.
_Key = tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype, torch.dtype]
_CONVERSIONS: OrderedDict[_Key, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = OrderedDict()
_CONVERSIONS_KEPT = 64


def _converted(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.dtype == dtype:
        return t.detach()
    owner = t if t._base is None else t._base
    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, dtype)
    hit = _CONVERSIONS.get(key)
    if hit is not None and hit[0]() is owner and hit[1] == t._version:
        _CONVERSIONS.move_to_end(key)
        return hit[2]
    out = t.detach().to(dtype)
    _CONVERSIONS[key] = (weakref.ref(owner), t._version, out)
    while len(_CONVERSIONS) > _CONVERSIONS_KEPT:
        _CONVERSIONS.popitem(last=False)
    return out


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    *, scoring: Scoring = TEXTBOOK, bias: torch.Tensor | None = None, causal: bool | str = False,
    fully_masked: str = "zeros", via_lse: bool = False, kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores(q, k) + mask) v, computed in the dtype of q.

    Args:
        q: (..., Lq, Hd); k: (..., Lk, Hd); v: (..., Lk, Hv): heads as the scores see them (their
            norm and rotary already applied: :meth:`Scoring.split`).
        mask: None, bool keep-mask (True = may attend) or additive float (finite values are
            biases, applied exactly), broadcasting to (..., Lq, Lk).
        scoring: scale (default 1 / sqrt(Hd)), soft-cap and window (:mod:`mha.scoring`).
        bias: the position bias broadcasting to (..., Lq, Lk) (:meth:`PositionBias.heads`), or None.
        causal: also remove the keys causality hides (:func:`mha.masks.causal_keep`): True or "top_left",
            keys j > i for query i (SDPA's ``is_causal``); "bottom_right", keys j > i + Lk - Lq (a decode
            step's alignment; with Lq > Lk the first Lq - Lk rows are fully masked).
        fully_masked: what a query row with every key removed gets: "zeros" (our contract:
            zero weights, zero output), "uniform" (weights 1/Lk over all keys, as a layer that masks
            with ``finfo.min`` computes), "uniform_visible" (spread over the keys that causality and
            the window leave: a layer whose own causal finfo.min, added to the caller's, overflows to
            -inf) or "nan".
        via_lse: weights as exp(score - lse), the form in which flash-style kernels recompute them in
            their backward pass: the per-row logsumexp ``lse`` stored by the forward pass, and the
            scores recomputed by the backward, are two roundings of the same scores (here: lse of
            the scores perturbed by one rounding error of the dtype, fixed seed). At scores of 1e4
            in float32 that moves every weight by ~1e-3 where exp(score - max) / sum is exact.
        kernel: the output from torch's fused ``scaled_dot_product_attention`` in q's dtype instead,
            on the same (rotated) heads and mask: another correct implementation, blocked, whose
            backward recomputes the weights from a stored logsumexp. Fully masked rows take the plain
            formula's output (the kernel's convention there is its own); every other row is the
            kernel's, whatever the rest of the batch holds (one fully masked item must not turn a
            whole batch's draw into the plain formula: the kernel's error is what calibrates).
    Returns:
        (output (..., Lq, Hv), weights (..., Lq, Lk)).
    """
    if fully_masked not in FULLY_MASKED:
        raise ValueError(f"fully_masked must be one of {FULLY_MASKED}, got fully_masked={fully_masked!r}")
    score, mask, hard = masked_scores(q, k, mask, scoring=scoring, bias=bias, causal=causal)
    row_max = score.amax(dim=-1, keepdim=True)  # (..., Lq, 1)
    has_key = row_max > -math.inf
    # subtract the row maximum (a fully masked row subtracts 0) so exp never overflows
    e = torch.exp(score - torch.where(has_key, row_max, torch.zeros_like(row_max)))
    total = e.sum(dim=-1, keepdim=True)
    masked_rows = {"zeros": torch.zeros_like(e), "uniform": torch.full_like(e, 1.0 / e.shape[-1]),
                   "uniform_visible": _uniform(e, hard),
                   "nan": torch.full_like(e, math.nan)}[fully_masked]
    if via_lse:
        eps = torch.finfo(score.dtype).eps
        jitter = 1 + eps * (2 * torch.rand(score.shape, generator=torch.Generator().manual_seed(0)) - 1)
        rounded = torch.where(torch.isfinite(score), score * jitter.to(score.dtype), score)
        lse = torch.logsumexp(rounded, dim=-1, keepdim=True)
        normalized = torch.exp(score - torch.where(has_key, lse, torch.zeros_like(lse)))
    else:
        normalized = e / torch.where(has_key, total, torch.ones_like(total))
    weights = torch.where(has_key, normalized, masked_rows)
    if kernel:  # every row through the fused kernel, as a layer calling it does; fully masked rows keep
        # the plain formula's output (torch.where selects: no gradient flows from the other branch)
        if scoring.softcap is not None:  # SDPA has no soft-cap: the plain formula is this draw
            return weights @ v, weights
        additive = additive_mask(mask, score.dtype)
        if bias is not None:
            additive = bias if additive is None else additive + bias
        scale = 1.0 / math.sqrt(q.shape[-1]) if scoring.scale is None else scoring.scale
        fused = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, scale=scale)
        return torch.where(has_key, fused, weights @ v), weights
    return weights @ v, weights


def masked_scores(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None, *, scoring: Scoring = TEXTBOOK,
    bias: torch.Tensor | None = None, causal: bool | str = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The scores :func:`attention` takes the softmax of, in q's dtype: (scores (..., Lq, Lk) with the
    mask, causality and the window applied (-inf or the mask's finite bias where a key is removed),
    the mask with causality and the window joined in, or None, and the hard (Lq, Lk) keep-mask of
    causality and the window, or None). Arguments as in :func:`attention`."""
    score = scoring.scores(q, k, bias)  # (..., Lq, Lk)
    hard: torch.Tensor | None = None  # (Lq, Lk): the keys causality and the window leave, None = all
    if causal:
        hard = causal_keep(score.shape[-2], score.shape[-1], score.device, align=causal)
        mask = hard if mask is None else _and(mask, hard)
    window = scoring.keep(score.shape[-2], score.shape[-1], causal, score.device)  # (Lq, Lk) or None
    if window is not None:
        mask = window if mask is None else _and(mask, window)
        hard = window if hard is None else hard & window
    masking = additive_mask(mask, score.dtype)
    if masking is not None:
        score = score + masking
    return score, mask, hard


def _uniform(e: torch.Tensor, hard: torch.Tensor | None) -> torch.Tensor:
    """Weights (..., Lq, Lk) spread evenly over the keys ``hard`` (Lq, Lk) keeps, every key if None.

    A layer masking with ``finfo.min`` under a causal or window mask of -inf (SDPA's ``is_causal``,
    or finfo.min added twice, which overflows to -inf) gives a fully masked row this: the soft
    mask's keys tie, the hard mask's stay out.
    """
    if hard is None:
        return torch.full_like(e, 1.0 / e.shape[-1])
    kept = hard.to(e.dtype)
    return (kept / kept.sum(dim=-1, keepdim=True).clamp(min=1)).expand_as(e)


def _and(mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``mask`` (keep-mask or additive) restricted to ``keep`` (bool), in ``mask``'s convention."""
    if mask.dtype == torch.bool:
        return mask & keep
    return mask.masked_fill(~keep, -math.inf)


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (..., In) @ w (Out, In)^T + b (Out,) -> (..., Out)."""
    y = x @ w.transpose(0, 1)
    return y if b is None else y + b


def multi_head(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int,
    mask: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float64, causal: bool | str = False,
    fully_masked: str = "zeros", scoring: Scoring = TEXTBOOK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed multi-head attention evaluated in ``dtype`` (float64 by default: the oracle).

    q (B, Lq, D), k (B, Lk, D), v (B, Lk, D); mask broadcasting to (B, H, Lq, Lk).
    Grouped-query attention where ``params.w_k`` has Hkv * Hd < D rows: query head i reads kv head
    ``scoring.kv_head(i)`` (i // g, g = H / Hkv, HF's ``repeat_kv``; i % Hkv tiled). ``causal``,
    ``fully_masked`` and ``scale`` (None: 1 / sqrt(Hd)) as in :func:`attention`.
    Returns (output (B, Lq, D), weights (B, H, Lq, Lk)), both in ``dtype``.
    """
    concat, weights = concat_heads(q, k, v, params, n_head, mask, dtype=dtype, causal=causal,
                                   fully_masked=fully_masked, scoring=scoring)
    return output_projection(concat, params.to(dtype)), weights


def concat_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int,
    mask: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float64, causal: bool | str = False,
    fully_masked: str = "zeros", scoring: Scoring = TEXTBOOK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`multi_head` before its output projection: (heads concatenated (B, Lq, D), weights
    (B, H, Lq, Lk)) in ``dtype``; ``output_projection`` of the first is ``multi_head``'s output."""
    q, k, v = q.detach().to(dtype), k.detach().to(dtype), v.detach().to(dtype)
    return _concat_heads(q, k, v, params.to(dtype), n_head, mask, causal=causal, fully_masked=fully_masked,
                         scoring=scoring)


def _concat_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: MHAParams, n_head: int, mask: torch.Tensor | None,
    *, causal: bool | str, fully_masked: str, via_lse: bool = False, scoring: Scoring = TEXTBOOK,
    kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`concat_heads` on inputs and weights already in one dtype, on autograd's graph."""
    d = q.shape[-1]
    hd = d // n_head
    n_kv = kv_heads(p, n_head)
    # (B, L, D) -> (B, L, H, Hd) -> (B, H, L, Hd); keys and values: (B, Hkv, L, Hd) repeated to H.
    # QK-norm and rotary act on the heads before the repeat (a per-head norm of k has Hkv rows)
    q, k, v = scoring.pre(q, "q", kernel), scoring.pre(k, "k", kernel), scoring.pre(v, "v", kernel)
    qh = _split(scoring.projected(_linear(q, p.w_q, p.b_q), "q"), n_head, hd)
    kh = _split(scoring.projected(_linear(k, p.w_k, p.b_k), "k"), n_kv, hd)
    vh = _split(scoring.projected(_linear(v, p.w_v, p.b_v), "v"), n_kv, hd)
    qh, kh, vh = scoring.split(qh, "q"), scoring.split(kh, "k"), scoring.split(vh, "v")
    kh, vh = scoring.repeat_kv(kh, n_head), scoring.repeat_kv(vh, n_head)
    m = None if mask is None else (mask if mask.dtype == torch.bool else mask.to(q.dtype))
    bias = None if scoring.bias is None else scoring.bias.heads(n_head, qh.shape[-2], kh.shape[-2], q.dtype)
    # (B, H, Lq, Hd), (B, H, Lq, Lk)
    heads, weights = attention(qh, kh, vh, m, causal=causal, fully_masked=fully_masked, scoring=scoring, bias=bias,
                               via_lse=via_lse, kernel=kernel)
    # (B, H, Lq, Hd) -> (B, Lq, H, Hd) -> (B, Lq, D)
    return heads.transpose(-3, -2).reshape(*q.shape[:-1], d), weights


def _split(y: torch.Tensor, n: int, hd: int) -> torch.Tensor:
    """(B, L, n * Hd) -> (B, L, n, Hd) -> (B, n, L, Hd)."""
    return y.reshape(*y.shape[:-1], n, hd).transpose(-3, -2)


def multi_head_graph(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int,
    mask: torch.Tensor | None = None, *, causal: bool | str = False, fully_masked: str = "zeros", via_lse: bool = False,
    scoring: Scoring = TEXTBOOK, kernel: bool = False,
) -> torch.Tensor:
    """:func:`multi_head`'s output (B, Lq, D), differentiable: nothing is detached or converted.

    q, k, v and every weight of ``params`` must share one dtype (the caller converts them, as
    leaves of its own graph); gradients flow to each of them that requires grad. ``via_lse`` and
    ``kernel`` as in :func:`attention`.
    """
    concat, _ = _concat_heads(q, k, v, params, n_head, mask, causal=causal, fully_masked=fully_masked,
                              scoring=scoring, via_lse=via_lse, kernel=kernel)
    return output_projection(concat, params)


def value_heads(v: torch.Tensor, params: MHAParams, n_head: int, *, dtype: torch.dtype = torch.float64,
                scoring: Scoring = TEXTBOOK) -> torch.Tensor:
    """The values each query head averages, as :func:`multi_head` forms them: v (B, Lk, D) -> (B, H, Lk, Hd)
    in ``dtype`` (projected, normalized where the layer normalizes values, repeated to the query heads by
    ``scoring.kv_map``). ``weights @ value_heads`` is the heads' output before the concatenation."""
    p = params.to(dtype)
    n_kv = kv_heads(params, n_head)
    hd = params.w_q.shape[0] // n_head
    vh = _split(scoring.projected(_linear(scoring.pre(v.detach().to(dtype), "v"), p.w_v, p.b_v), "v"), n_kv, hd)
    return scoring.repeat_kv(scoring.split(vh, "v"), n_head)


def same_precision(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int,
    mask: torch.Tensor | None = None, *, dtype: torch.dtype, oracle: torch.Tensor, causal: bool | str = False,
    fully_masked: str = "zeros", scoring: Scoring = TEXTBOOK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The "same-precision reference" that calibrates tolerances: :func:`multi_head` in ``dtype``.

    Evaluated twice, on the inputs as given and on inputs perturbed by one rounding error of
    ``dtype`` (relative, fixed seed); returns (output, weights) of the evaluation farther from
    ``oracle`` (B, Lq, D). One evaluation's error is a single draw of the rounding; where the
    problem is ill-conditioned (scores of 1e5 and more, where the softmax amplifies rounding),
    two draws bound what another correct implementation in ``dtype`` may do far better.
    """
    first = multi_head(q, k, v, params, n_head, mask, dtype=dtype, causal=causal, fully_masked=fully_masked,
                       scoring=scoring)
    eps = torch.finfo(dtype).eps
    gen = torch.Generator().manual_seed(0)

    def nudge(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(dtype) * (1 + eps * (2 * torch.rand(t.shape, generator=gen) - 1)).to(dtype)

    second = multi_head(nudge(q), nudge(k), nudge(v), params, n_head, mask, dtype=dtype, causal=causal,
                        fully_masked=fully_masked, scoring=scoring)

    def error(t: torch.Tensor) -> float:
        diff = (t.double() - oracle.double()).abs().nan_to_num(math.inf)
        return float(diff.max()) if diff.numel() else 0.0

    return max(first, second, key=lambda pair: error(pair[0]))


def rounding_bound(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int,
    mask: torch.Tensor | None = None, *, dtype: torch.dtype, causal: bool | str = False,
    scoring: Scoring = TEXTBOOK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bound, in float64, of how far rounding the scores in ``dtype`` moves the output
    (B, Lq, D) and the weights (B, H, Lq, Lk): (output bound, weights bound).

    A score s = (q_h / sqrt(Hd)) . k_h evaluated in ``dtype`` carries an error up to
    delta = 4u (|q_h| . |k_h|) / sqrt(Hd), u = eps / 2 (the roundings of q_h and k_h to the dtype,
    of the scaling and of the product; q_h, k_h the float64 projections). Each weight then lies
    in the interval the softmax gives with score j moved by +-delta_j and every other score the
    other way (exact for perturbations of up to delta, not a first-order estimate: a near tie
    moves by up to 1/2); the output moves by sum_j |dP_j| |V_h,j|, through |W_o|.

    Where two scores of a row lie within delta of each other (a near tie; in bfloat16 the scores
    near 3e3 are 16 apart), every implementation in ``dtype`` may split the row's weight between
    them differently, and one evaluation of the plain formula is no measure of that: this bound is.
    It is ~u |s| P, negligible wherever the scores are small. The interval is computed from the
    float64 scores in log space: at scores of 1e4 and more delta passes 700, where the weights'
    exponentials overflow and a key 745 below its row's maximum has a weight of exactly 0 in
    float64 that rounding in ``dtype`` can still lift. Rows without a key (every convention for
    them is exact) do not move.
    """
    u = torch.finfo(dtype).eps / 2
    p = params.to(torch.float64)
    d = q.shape[-1]
    hd = d // n_head
    n_kv = kv_heads(params, n_head)

    def heads(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, n: int, which: str) -> torch.Tensor:
        y = _linear(scoring.pre(x.detach().to(torch.float64), which), w, b)  # (B, L, n*Hd)
        y = scoring.split(_split(scoring.projected(y, which), n, hd), which)  # (B, n, L, Hd), normed and rotated
        return scoring.repeat_kv(y, n_head)

    qh, kh = heads(q, p.w_q, p.b_q, n_head, "q"), heads(k, p.w_k, p.b_k, n_kv, "k")  # (B, H, L, Hd)
    vh = heads(v, p.w_v, p.b_v, n_kv, "v").abs()
    bias = None if scoring.bias is None else scoring.bias.heads(n_head, q.shape[-2], k.shape[-2], torch.float64)
    m = None if mask is None else (mask if mask.dtype == torch.bool else mask.to(torch.float64))
    s, _, _ = masked_scores(qh, kh, m, scoring=scoring, bias=bias, causal=causal)  # (B, H, Lq, Lk)
    scale = 1 / math.sqrt(hd) if scoring.scale is None else abs(scoring.scale)
    # a QK-norm rounds q and k once more; the cap's division, tanh and product round the score
    # thrice (tanh shrinks the error it is given); a bias adds its own rounding
    roundings = 4 + (scoring.q_norm is not None) + (scoring.k_norm is not None)
    delta = roundings * u * (qh.abs() @ kh.abs().transpose(-2, -1)) * scale  # (B, H, Lq, Lk)
    if scoring.softcap is not None:
        delta = delta + 3 * u * scoring.softcap
    if bias is not None:
        delta = delta + u * bias.abs()
    kept = torch.isfinite(s)  # a key no mask removes (a finite bias, finfo.min included, keeps it)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    weights = torch.where(kept, torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))), 0.0)
    delta = torch.where(kept, delta, torch.zeros_like(delta))
    raised = torch.where(kept, s + delta, -math.inf)
    lowered = torch.where(kept, s - delta, -math.inf)
    # weight j is lowest with s_j lowered and every other score raised: sigmoid(s_j - delta_j - log R_j),
    # R_j the others' raised exponentials, log R_j = log(sum_i e^(s_i + delta_i)) + log(1 - e^(s_j + delta_j
    # - that)); highest the other way round. Never exp(2 delta), which overflows at delta > 355
    others_raised = _log_sum_without(raised)
    others_lowered = _log_sum_without(lowered)
    low = torch.sigmoid(lowered - others_raised)
    high = torch.sigmoid(raised - others_lowered)
    moved = torch.where(kept, torch.maximum(high - weights, weights - low), torch.zeros_like(weights))
    moved = moved.nan_to_num(0.0).clamp(0.0, 1.0)
    out = (moved @ vh).transpose(-3, -2).reshape(*q.shape[:-1], d)  # (B, Lq, D)
    return (out if p.w_o is None else out @ p.w_o.abs().transpose(0, 1)), moved


def _log_sum_without(x: torch.Tensor) -> torch.Tensor:
    """log(sum_{i != j} e^(x_i)) for each j along the last axis (-inf where x_j is the row's only
    mass, and on rows of -inf), without forming Lk sums of Lk terms: for every j but the row's
    largest, the row's logsumexp less e^(x_j), log(1 - e^(x_j - lse)) being well conditioned there
    (x_j - lse <= log 1/2); for the largest, the logsumexp of the row without it (where the others are
    700 below it, lse less e^(x_j) cancels to nothing in float64)."""
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    finite = torch.isfinite(lse)
    gap = torch.where(finite, x - torch.where(finite, lse, torch.zeros_like(lse)), -math.inf).clamp(max=0.0)
    rest = torch.where(finite, lse + torch.log(-torch.expm1(gap)), -math.inf)
    top = x.argmax(dim=-1, keepdim=True)
    without_top = torch.logsumexp(x.scatter(-1, top, -math.inf), dim=-1, keepdim=True)
    is_top = torch.arange(x.shape[-1], device=x.device) == top
    return torch.where(is_top, without_top, rest)


def kv_heads(params: MHAParams, n_head: int) -> int:
    """Hkv, the number of key/value heads (H for multi-head, fewer for grouped-query attention).

    Read from the shape of ``w_k`` (Hkv * Hd, D); ValueError if it does not divide H.
    """
    d = params.w_q.shape[0]
    hd = d // n_head
    rows = params.w_k.shape[0]
    if rows % hd or n_head % (rows // hd):
        raise ValueError(f"w_k has {rows} rows: not a whole number of key heads of width Hd={hd} dividing "
                         f"n_head={n_head}")
    return rows // hd


def output_projection(concat: torch.Tensor, p: MHAParams) -> torch.Tensor:
    """(B, Lq, D) -> (B, Lq, D): the output projection, or the concatenated heads for a layer without one."""
    if p.w_o is None:
        return concat if p.b_o is None else concat + p.b_o
    return _linear(concat, p.w_o, p.b_o)


def head_slices(params: MHAParams, n_head: int, scoring: Scoring = TEXTBOOK) -> list[MHAParams]:
    """Split packed weights into per-head input projections W_i^Q, W_i^K, W_i^V: (Hd, D) each.

    Head i owns output features i*Hd .. (i+1)*Hd of the query projection and those of key
    head ``scoring.kv_head(i)`` of the key and value projections (i // g with g = H / Hkv, or i % Hkv
    tiled; i without grouping). The
    output projection is not split: the per-head formulation applies it after
    concatenation, so w_o and b_o are repeated whole in every element.
    """
    d = params.w_q.shape[0]
    hd = d // n_head
    n_kv = kv_heads(params, n_head)
    out = []
    for i in range(n_head):
        rows = slice(i * hd, (i + 1) * hd)
        j = scoring.kv_head(i, n_head, n_kv)
        kv = slice(j * hd, (j + 1) * hd)
        out.append(MHAParams(
            params.w_q[rows], None if params.b_q is None else params.b_q[rows],
            params.w_k[kv], None if params.b_k is None else params.b_k[kv],
            params.w_v[kv], None if params.b_v is None else params.b_v[kv],
            params.w_o, params.b_o,
        ))
    return out


def head_mask(mask: torch.Tensor | None, i: int) -> torch.Tensor | None:
    """Head i's slice of a mask broadcasting to (B, H, Lq, Lk): (B|1, Lq, Lk), or rank <= 2 as is."""
    if mask is None or mask.dim() < 3:
        return mask
    m = mask if mask.shape[-3] == 1 else mask[..., i:i + 1, :, :]
    return m.squeeze(-3) if m.dim() == 4 else m  # (B|1, 1, Lq, Lk) -> (B|1, Lq, Lk)


def one_head(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int, i: int,
    mask: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float64, causal: bool | str = False,
    fully_masked: str = "zeros", scoring: Scoring = TEXTBOOK,
) -> torch.Tensor:
    """head_i = Attention(q W_i^Q, k W_i^K, v W_i^V) alone: (B, Lq, Hd) in ``dtype``.

    Its per-head norm row, position bias and rotary are head i's; a norm over all heads couples
    them, and there is no head alone: ValueError (:attr:`Scoring.coupled_heads`)."""
    if scoring.coupled_heads:
        raise ValueError("one_head: q or k is normalized over all heads (norm over='all'): no head is computed alone")
    p = head_slices(params.to(dtype), n_head, scoring)[i]
    q, k, v = (scoring.pre(t.detach().to(dtype), w) for t, w in zip((q, k, v), "qkv", strict=True))
    m = head_mask(mask, i)
    if m is not None and m.dtype != torch.bool:
        m = m.to(dtype)
    kv_head = scoring.kv_head(i, n_head, kv_heads(params, n_head))
    qh = scoring.split(_linear(q, p.w_q, p.b_q), "q", head=i)  # (B, Lq, Hd)
    kh = scoring.split(_linear(k, p.w_k, p.b_k), "k", head=kv_head)  # (B, Lk, Hd)
    bias = None if scoring.bias is None else scoring.bias.heads(n_head, q.shape[-2], k.shape[-2], dtype)[i]
    vh = scoring.split(_linear(v, p.w_v, p.b_v), "v", head=kv_head)  # (B, Lk, Hd)
    head, _ = attention(qh, kh, vh, m, causal=causal, fully_masked=fully_masked, scoring=scoring, bias=bias)
    return head


def per_head(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int,
    mask: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float64, causal: bool | str = False,
    fully_masked: str = "zeros", scoring: Scoring = TEXTBOOK,
) -> torch.Tensor:
    """The paper's formulation: head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), then
    Concat(head_1..head_H) W_o. Same shapes and mask contract as :func:`multi_head`;
    returns the output (B, Lq, D) in ``dtype``.
    """
    heads = [one_head(q, k, v, params, n_head, i, mask, dtype=dtype, causal=causal, fully_masked=fully_masked,
                      scoring=scoring) for i in range(n_head)]  # (B, Lq, Hd) each
    concat = torch.cat(heads, dim=-1)  # (B, Lq, D)
    return output_projection(concat, params.to(dtype))
