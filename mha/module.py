"""The reference multi-head attention module (the API of seed 000, with its defects fixed)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

from mha_verify.mha.contract import check_mask, check_qkv, check_sizes
from mha_verify.mha.masks import rows_with_a_key


class MultiHeadAttention(nn.Module):
    """Multi-head attention, ``MultiHead(Q, K, V) = Concat(head_1..head_H) W_o``.

    Args:
        d_model: model width D (> 0).
        n_head: number of heads H (> 0, divides D); each head has width Hd = D // H.
        dropout: probability of zeroing an attention weight, in training mode only.
        bias: whether the projections ``w_q, w_k, w_v, w_o`` (each nn.Linear D -> D) have biases.

    Contract of :meth:`forward`:
        * q (B, Lq, D), k (B, Lk, D), v (B, Lv, D) with Lk == Lv; Lq and Lk are independent.
        * mask: None, a bool keep-mask (True = this query may attend to this key) or an
          additive float mask (0 keeps, -inf removes), of any shape that broadcasts to
          (B, H, Lq, Lk), e.g. (Lq, Lk), (1, 1, Lq, Lk), (B, 1, Lq, Lk), (B, H, Lq, Lk).
          Integer masks are rejected as ambiguous.
        * A query row whose keys are all masked gets zero attention weights, so its output
          row is ``w_o(0) = w_o.bias``. Never NaN.
        * Dropout acts on the attention weights, in training mode only.
        * Bad input raises ValueError/TypeError naming the argument and the values.
        * ``need_weights=False`` (default) takes the fast path through
          F.scaled_dot_product_attention and returns the output (B, Lq, D);
          ``need_weights=True`` takes the explicit math path and returns
          (output (B, Lq, D), weights (B, H, Lq, Lk)), the weights after dropout.
    """

    # Declared for verification harnesses (mha-verify reads it): both mask conventions are native.
    mha_verify_conventions: ClassVar[dict[str, object]] = {"mask": ("bool", "float"), "fully_masked": "zeros"}

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.1, bias: bool = True) -> None:
        super().__init__()
        check_sizes(d_model, n_head, dropout)
        self.d_model = d_model
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.dropout = nn.Dropout(dropout)
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    # ``need_weights`` is positional-or-keyword, not keyword-only: torch's TorchScript exporter
    # (torch.onnx.export(..., dynamo=False)) passes the defaults of every parameter positionally,
    # and a keyword-only one made it fail with "forward() takes from 4 to 5 positional arguments
    # but 6 were given". Callers still pass it by keyword; the contract is unchanged.
    @overload
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
        need_weights: Literal[False] = False,
    ) -> torch.Tensor: ...

    @overload
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
        need_weights: Literal[True],
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
        *, need_weights: Literal[True],
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        weight = self.w_q.weight
        B, Lq, Lk = check_qkv(q, k, v, d_model=self.d_model, dtype=weight.dtype, device=weight.device)
        if mask is not None:
            check_mask(mask, target=(B, self.n_head, Lq, Lk), dtype=q.dtype, device=q.device)
            if mask.dim() < 2:  # (Lk,) or a scalar: SDPA wants at least (Lq|1, Lk)
                mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
        # (B, L, D) -> (B, L, H, Hd) -> (B, H, L, Hd); unflatten keeps B and L symbolic in exports
        qh = self.w_q(q).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        kh = self.w_k(k).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        vh = self.w_v(v).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
        if need_weights:
            heads, weights = self._math_attention(qh, kh, vh, mask)
        else:
            heads = self._fast_attention(qh, kh, vh, mask)
        # (B, H, Lq, Hd) -> (B, Lq, H, Hd) -> (B, Lq, D)
        out = self.w_o(heads.transpose(1, 2).flatten(-2))
        return (out, weights) if need_weights else out

    def _fast_attention(
        self, qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(B, H, Lq, Hd), (B, H, Lk, Hd) x2 -> (B, H, Lq, Hd) through F.scaled_dot_product_attention."""
        p = self.dropout.p if self.training else 0.0
        # SDPA's default scale is 1 / sqrt(Hd), the same as self.scale
        heads = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=p)
        if mask is not None and (torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting()):
            # Eager SDPA already returns zeros for fully masked rows (PyTorch >= 2.5); its ONNX
            # lowerings do not all do so, so exported graphs zero those rows explicitly.
            heads = heads * rows_with_a_key(mask).to(heads.dtype)
        return heads

    def _math_attention(
        self, qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The seed's explicit formula, returning (heads (B, H, Lq, Hd), weights (B, H, Lq, Lk))."""
        # q scaled before the product: (q k^T) * scale overflows float16 (65504) before the scale
        # brings the scores back, at inputs of magnitude ~80 and head width 128
        score = torch.matmul(qh * self.scale, kh.transpose(-2, -1))  # (B, H, Lq, Lk)
        if mask is not None:
            if mask.dtype == torch.bool:
                score = score.masked_fill(~mask, float("-inf"))
            else:
                score = score + mask
            # A row with every key masked would be softmax(-inf, ..., -inf) = NaN: give it zeros.
            has_key = score.amax(dim=-1, keepdim=True) > float("-inf")  # (B, H, Lq, 1)
            weights = torch.softmax(score.masked_fill(~has_key, 0.0), dim=-1).masked_fill(~has_key, 0.0)
        else:
            weights = torch.softmax(score, dim=-1)
        weights = self.dropout(weights)
        return torch.matmul(weights, vh), weights

