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
from typing import NamedTuple

import torch


class MHAParams(NamedTuple):
    """The weights of a multi-head attention layer, in nn.Linear's (out, in) layout.

    w_q, w_k, w_v, w_o: (D, D); b_q, b_k, b_v, b_o: (D,) or None (no bias).
    """

    w_q: torch.Tensor
    b_q: torch.Tensor | None
    w_k: torch.Tensor
    b_k: torch.Tensor | None
    w_v: torch.Tensor
    b_v: torch.Tensor | None
    w_o: torch.Tensor
    b_o: torch.Tensor | None

    def to(self, dtype: torch.dtype) -> MHAParams:
        """All weights detached and converted to ``dtype``."""
        return MHAParams._make(None if t is None else t.detach().to(dtype) for t in self)


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A bool keep-mask or additive float mask -> additive mask of ``dtype`` (0 keeps, -inf removes)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -math.inf)
    return mask.to(dtype)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    *, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + mask) v, computed in the dtype of q.

    Args:
        q: (..., Lq, Hd); k: (..., Lk, Hd); v: (..., Lk, Hv).
        mask: None, bool (True = may attend) or additive float, broadcasting to (..., Lq, Lk).
        scale: defaults to 1 / sqrt(Hd).
    Returns:
        (output (..., Lq, Hv), weights (..., Lq, Lk)); rows whose keys are all masked have
        zero weights and a zero output.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    score = (q @ k.transpose(-2, -1)) * scale  # (..., Lq, Lk)
    bias = additive_mask(mask, score.dtype)
    if bias is not None:
        score = score + bias
    row_max = score.amax(dim=-1, keepdim=True)  # (..., Lq, 1)
    alive = row_max > -math.inf
    # subtract the row maximum (a dead row subtracts 0) so exp never overflows
    e = torch.exp(score - torch.where(alive, row_max, torch.zeros_like(row_max)))
    total = e.sum(dim=-1, keepdim=True)
    weights = torch.where(alive, e / torch.where(alive, total, torch.ones_like(total)), torch.zeros_like(e))
    return weights @ v, weights


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (..., In) @ w (Out, In)^T + b (Out,) -> (..., Out)."""
    y = x @ w.transpose(0, 1)
    return y if b is None else y + b


def multi_head(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int,
    mask: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed multi-head attention evaluated in ``dtype`` (float64 by default: the oracle).

    q (B, Lq, D), k (B, Lk, D), v (B, Lk, D); mask broadcasting to (B, H, Lq, Lk).
    Returns (output (B, Lq, D), weights (B, H, Lq, Lk)), both in ``dtype``.
    """
    p = params.to(dtype)
    q, k, v = q.detach().to(dtype), k.detach().to(dtype), v.detach().to(dtype)
    d = q.shape[-1]
    hd = d // n_head
    # (B, L, D) -> (B, L, H, Hd) -> (B, H, L, Hd)
    qh = _linear(q, p.w_q, p.b_q).reshape(*q.shape[:-1], n_head, hd).transpose(-3, -2)
    kh = _linear(k, p.w_k, p.b_k).reshape(*k.shape[:-1], n_head, hd).transpose(-3, -2)
    vh = _linear(v, p.w_v, p.b_v).reshape(*v.shape[:-1], n_head, hd).transpose(-3, -2)
    m = None if mask is None else (mask if mask.dtype == torch.bool else mask.to(dtype))
    heads, weights = attention(qh, kh, vh, m)  # (B, H, Lq, Hd), (B, H, Lq, Lk)
    # (B, H, Lq, Hd) -> (B, Lq, H, Hd) -> (B, Lq, D)
    concat = heads.transpose(-3, -2).reshape(*q.shape[:-1], d)
    return _linear(concat, p.w_o, p.b_o), weights


def head_slices(params: MHAParams, n_head: int) -> list[MHAParams]:
    """Split packed weights into per-head input projections W_i^Q, W_i^K, W_i^V: (Hd, D) each.

    Head i owns output features i*Hd .. (i+1)*Hd of each D x D input projection. The output
    projection is not split: the per-head formulation applies it after concatenation, so
    w_o and b_o are repeated whole in every element.
    """
    d = params.w_q.shape[0]
    hd = d // n_head
    out = []
    for i in range(n_head):
        rows = slice(i * hd, (i + 1) * hd)
        out.append(MHAParams(
            params.w_q[rows], None if params.b_q is None else params.b_q[rows],
            params.w_k[rows], None if params.b_k is None else params.b_k[rows],
            params.w_v[rows], None if params.b_v is None else params.b_v[rows],
            params.w_o, params.b_o,
        ))
    return out


def per_head(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: MHAParams, n_head: int,
    mask: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The paper's formulation: head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), then
    Concat(head_1..head_H) W_o. Same shapes and mask contract as :func:`multi_head`;
    returns the output (B, Lq, D) in ``dtype``.
    """
    q, k, v = q.detach().to(dtype), k.detach().to(dtype), v.detach().to(dtype)
    heads = []
    for i, p in enumerate(head_slices(params.to(dtype), n_head)):
        m = None
        if mask is not None:
            m = mask if mask.dim() < 3 or mask.shape[-3] == 1 else mask[..., i, :, :]
            if m.dtype != torch.bool:
                m = m.to(dtype)
            if m.dim() == 4:
                m = m.squeeze(-3)  # (B|1, 1, Lq, Lk) -> (B|1, Lq, Lk)
        head, _ = attention(_linear(q, p.w_q, p.b_q), _linear(k, p.w_k, p.b_k), _linear(v, p.w_v, p.b_v), m)
        heads.append(head)  # (B, Lq, Hd)
    concat = torch.cat(heads, dim=-1)  # (B, Lq, D)
    return _linear(concat, params.w_o.detach().to(dtype), None if params.b_o is None else params.b_o.detach().to(dtype))
