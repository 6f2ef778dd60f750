"""How a layer forms its attention scores, beyond the textbook's q k^T / sqrt(Hd): the conventions
the oracle applies exactly, in this order, to the heads of one example.

1. QK-norm (:class:`Norm`): q and k projections normalized, over each head's Hd or over the whole
   projection before the split (Qwen3, Gemma 3 per head; OLMo 2 over all heads); values too where a
   layer normalizes them (Gemma 4's weightless ``v_norm``).
2. Rotary embeddings (:class:`mha.rotary.Rotary`) on the normalized heads.
3. ``scale`` (None: 1 / sqrt(Hd)), then logit soft-capping ``cap * tanh(s / cap)`` (Gemma 2, Grok).
4. An additive position bias per head (:class:`PositionBias`: ALiBi from its formula, or a table a
   layer computes, T5's ``compute_bias``).
5. A sliding window of W keys: query i sees keys j with i - W < j <= i under a causal mask (i read as
   i + Lk - Lq bottom-right aligned), and |i - j| < W without one (HF's ``sliding_window_overlay`` and its
   bidirectional twin).

With grouped-query attention (Hkv < H key/value heads, g = H / Hkv) ``kv_map`` says which query heads
share a key/value head: "interleave" (query head i reads kv head i // g: HF's ``repeat_kv``, torch's
``repeat_interleave``, SDPA's ``enable_gqa``) or "tile" (kv head i % Hkv: ``kv.repeat(1, g, 1, 1)``).

Then the mask and the softmax (:func:`mha.reference.attention`). Written from the formulas,
independent of any library: a layer verified under these has its own norm, cap, bias and window
verified, not replaced. The one exception is a bias ``table`` read from the layer: its entries are
the layer's (a lookup, exact in any dtype), and what is verified is how the layer adds them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mha_verify.mha.masks import causal_offset
from mha_verify.mha.rotary import Rotary

NORM_KINDS = ("rms", "layer", "l2")
#: which query heads share a key/value head (see the module's docstring)
KV_MAPS = ("interleave", "tile")
NORM_OVER = ("head", "all")


@dataclass(frozen=True, eq=False)
class Norm:
    """One QK-norm: ``kind`` "rms" (x / sqrt(mean(x^2) + eps)), "layer" ((x - mean) / sqrt(var + eps)) or
    "l2" (x / sqrt(sum(x^2) + eps): nGPT's unit sphere), then times ``offset + weight`` (Gemma's RMSNorm
    multiplies by 1 + w: offset 1) plus ``bias``.

    over: "head", normalized over each head's Hd columns, ``weight`` (Hd,) shared by every head or
    (n, Hd) one row per head; "all", over the whole projection (n * Hd,) before the split into heads.
    Tensors are the layer's own parameters (live: a re-drawn weight is seen), converted on use.
    """

    kind: str
    over: str
    eps: float | None  # None: the epsilon of the input's dtype (torch's nn.RMSNorm(eps=None))
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    offset: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in NORM_KINDS:
            raise ValueError(f"norm kind must be one of {NORM_KINDS}, got kind={self.kind!r}")
        if self.over not in NORM_OVER:
            raise ValueError(f"norm over must be one of {NORM_OVER}, got over={self.over!r}")
        if self.eps is not None and not (math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"norm eps must be a finite number >= 0, got eps={self.eps!r}")

    def describe(self) -> str:
        kind = {"rms": "RMSNorm", "layer": "LayerNorm", "l2": "L2 norm"}[self.kind]
        where = "per head" if self.over == "head" else "over all heads"
        eps = "the input dtype's epsilon" if self.eps is None else f"{self.eps:g}"
        return f"{kind} {where}" + (", x (1 + w)" if self.offset == 1.0 else "") + f", eps {eps}"

    def eps_for(self, dtype: torch.dtype) -> float:
        """The epsilon added for inputs of ``dtype``: the stated one, else ``finfo(dtype).eps``."""
        return torch.finfo(dtype).eps if self.eps is None else self.eps

    def apply(self, y: torch.Tensor, head: int | None = None, kernel: bool = False) -> torch.Tensor:
        """y normalized over its last axis, in y's dtype: (..., n, L, Hd) heads for "head" (or one head
        (..., L, Hd) with its index ``head``), (..., L, n * Hd) for "all".

        The statistics are computed in float32 at least, as layers compute them in half precision
        (HF's RMSNorm upcasts), so the same-precision reference carries the layers' rounding.
        ``kernel``: a LayerNorm with one weight row through torch's fused ``layer_norm`` in y's dtype, as
        ``nn.LayerNorm`` runs it: its backward rounds where the formula is exact (over one feature
        the gradient is 0, and the float32 kernel's is ~6e-5 x 1/sqrt(eps)), a correct evaluation
        the same-precision draws must include."""
        if kernel and self.kind == "layer" and all(t is None or t.dim() == 1 for t in (self.weight, self.bias)):
            w, b = (None if t is None else t.detach().to(y.dtype) for t in (self.weight, self.bias))
            if w is not None and self.offset:
                w = w + self.offset
            return torch.nn.functional.layer_norm(y, y.shape[-1:], w, b, self.eps_for(y.dtype))
        exact = torch.float64 if y.dtype == torch.float64 else torch.float32
        x = y.to(exact)
        if self.kind == "layer":
            x = x - x.mean(dim=-1, keepdim=True)
        power = x.pow(2).sum(dim=-1, keepdim=True) if self.kind == "l2" else x.pow(2).mean(dim=-1, keepdim=True)
        # F.normalize's clamp of the norm at 1e-12 (vit-pytorch's RMSNorm, eps 0): a zero row stays zero
        floor = 1e-24 if self.kind == "l2" else 1e-24 / x.shape[-1]
        x = x * torch.rsqrt((power + self.eps_for(y.dtype)).clamp_min(floor))
        out = x.to(y.dtype)
        if self.weight is not None:
            w = self.weight.detach().to(y.dtype)
            if w.dim() == 2:  # (n, Hd): one row per head
                w = w[head] if head is not None else w[:, None, :]  # (Hd,) or (n, 1, Hd)
            out = out * (w + self.offset) if self.offset else out * w
        if self.bias is not None:
            b = self.bias.detach().to(y.dtype)
            if b.dim() == 2:
                b = b[head] if head is not None else b[:, None, :]
            out = out + b
        return out


def alibi_slopes(n_head: int) -> list[float]:
    """ALiBi's head slopes (Press et al.): 2^(-8 i / n) for i = 1..n when n is a power of two; else
    those of the nearest lower power of two, then every other slope of the next one (BLOOM's
    ``build_alibi_tensor``)."""
    if n_head < 1:
        raise ValueError(f"n_head must be >= 1, got n_head={n_head}")
    low = 2 ** math.floor(math.log2(n_head))
    slopes = [2.0 ** (-8.0 * i / low) for i in range(1, low + 1)]
    if low < n_head:
        extra = [2.0 ** (-8.0 * i / (2 * low)) for i in range(1, 2 * low + 1, 2)]
        slopes += extra[: n_head - low]
    return slopes


#: A layer's own bias table: (Lq, Lk, dtype) -> (H, Lq, Lk) or (1, H, Lq, Lk)
BiasTable = Callable[[int, int], torch.Tensor]


@dataclass(frozen=True, eq=False)
class PositionBias:
    """An additive bias b[h, i, j] on head h's scores: ALiBi, slope_h * (j - i) (equal, row by row and
    so after the softmax, to BLOOM's slope_h * j); or a ``table`` the layer computes for (Lq, Lk)."""

    alibi: bool = False
    table: BiasTable | None = field(default=None, repr=False)
    source: str = ""

    def __post_init__(self) -> None:
        if self.alibi == (self.table is not None):
            raise ValueError("a position bias is either alibi=True or a table, not both or neither")

    def describe(self) -> str:
        return "ALiBi position bias" if self.alibi else f"position bias from {self.source or 'the layer'}"

    def heads(self, n_head: int, lq: int, lk: int, dtype: torch.dtype) -> torch.Tensor:
        """The bias (H, Lq, Lk) in ``dtype``."""
        if self.alibi:
            slopes = torch.tensor(alibi_slopes(n_head), dtype=torch.float64)[:, None, None]  # (H, 1, 1)
            distance = torch.arange(lk, dtype=torch.float64)[None, :] - torch.arange(lq, dtype=torch.float64)[:, None]
            return (slopes * distance).to(dtype)  # (H, Lq, Lk)
        assert self.table is not None
        with torch.no_grad():
            got = self.table(lq, lk).detach()
        got = got.reshape(got.shape[-3:]) if got.dim() == 4 and got.shape[0] == 1 else got
        if got.dim() != 3 or tuple(got.shape[-2:]) != (lq, lk) or got.shape[0] not in (1, n_head):
            raise ValueError(f"the layer's position bias has shape {tuple(got.shape)}, expected "
                             f"({n_head}, {lq}, {lk})")
        return got.to(dtype).expand(n_head, lq, lk)


@dataclass(frozen=True, eq=False)
class Scoring:
    """Everything that forms a layer's scores besides the mask (see the module's docstring).

    scale: the factor on q k^T (None: 1 / sqrt(Hd)); rotary; q_norm, k_norm, v_norm; softcap (a cap > 0, or
    None); bias; window (W >= 1 keys, or None); kv_map (:data:`KV_MAPS`); input_norm: a norm of the queries'
    input over D before the projections (vit-pytorch's pre-norm ``x = self.norm(x)``); context_norm: that of
    the keys' and values' input (the same norm in a self-attention layer; None where a cross-attention
    layer projects its context raw, ``kv = default(context, self.norm(x))``). The default is the
    textbook's attention."""

    scale: float | None = None
    rotary: Rotary | None = None
    q_norm: Norm | None = None
    k_norm: Norm | None = None
    v_norm: Norm | None = None
    softcap: float | None = None
    bias: PositionBias | None = None
    window: int | None = None
    kv_map: str = "interleave"
    input_norm: Norm | None = None
    context_norm: Norm | None = None

    def __post_init__(self) -> None:
        if self.kv_map not in KV_MAPS:
            raise ValueError(f"kv_map must be one of {KV_MAPS}, got kv_map={self.kv_map!r}")
        if self.softcap is not None and not (math.isfinite(self.softcap) and self.softcap > 0):
            raise ValueError(f"softcap must be a finite number > 0 or None, got softcap={self.softcap!r}")
        if self.window is not None and (isinstance(self.window, bool) or self.window < 1):
            raise ValueError(f"window must be an int >= 1 or None, got window={self.window!r}")

    @property
    def positional(self) -> bool:
        """The scores depend on positions (rotary, bias, window): permuting positions changes them."""
        return self.rotary is not None or self.bias is not None or self.window is not None

    @property
    def coupled_heads(self) -> bool:
        """A norm over all heads: one head's output depends on the other heads' projections."""
        return any(n is not None and n.over == "all" for n in (self.q_norm, self.k_norm, self.v_norm))

    def describe(self) -> list[str]:
        out = []
        pre = {"queries": self.input_norm, "keys and values": self.context_norm}
        if pre["queries"] is not None and pre["queries"] is pre["keys and values"]:
            pre = {"inputs": self.input_norm}
        for what, norm in pre.items():
            if norm is not None:
                out.append(f"{what} {norm.describe().replace(' over all heads', ' over D')} before the projections")
        if self.q_norm is not None:
            out.append(f"q {self.q_norm.describe()}")
        if self.k_norm is not None:
            out.append(f"k {self.k_norm.describe()}")
        if self.v_norm is not None:
            out.append(f"v {self.v_norm.describe()}")
        if self.scale is not None:
            out.append(f"softmax scale {self.scale:.6g}")
        if self.rotary is not None:
            out.append(self.rotary.describe())
        if self.softcap is not None:
            out.append(f"logits soft-capped at {self.softcap:g}")
        if self.bias is not None:
            out.append(self.bias.describe())
        if self.window is not None:
            out.append(f"sliding window of {self.window} keys")
        if self.kv_map != "interleave":
            out.append(f"grouped-query heads mapped by {self.kv_map}")
        return out

    def kv_head(self, i: int, n_head: int, n_kv: int) -> int:
        """The key/value head query head ``i`` reads (of ``n_kv``, which divides ``n_head``)."""
        return i // (n_head // n_kv) if self.kv_map == "interleave" else i % n_kv

    def repeat_kv(self, t: torch.Tensor, n_head: int) -> torch.Tensor:
        """Key or value heads (..., Hkv, L, Hd) -> (..., H, L, Hd): row i is kv head ``kv_head(i)``."""
        g = n_head // t.shape[-3]
        if g == 1:
            return t
        if self.kv_map == "interleave":
            return t.repeat_interleave(g, dim=-3)
        return t.repeat(*([1] * (t.dim() - 3)), g, 1, 1)

    def fold_kv(self, t: torch.Tensor, n_kv: int) -> torch.Tensor:
        """The transpose of :meth:`repeat_kv`: (..., H, L, Hd) -> (..., Hkv, L, Hd), summing the query heads
        that share each key/value head (gradients flowing back to it)."""
        n_head = t.shape[-3]
        if n_kv == n_head:
            return t
        g = n_head // n_kv
        shape = (*t.shape[:-3], n_kv, g) if self.kv_map == "interleave" else (*t.shape[:-3], g, n_kv)
        return t.reshape(*shape, *t.shape[-2:]).sum(-3 if self.kv_map == "interleave" else -4)

    def pre(self, x: torch.Tensor, which: str, kernel: bool = False) -> torch.Tensor:
        """An input (..., L, D) as the ``which`` ("q", "k" or "v") projection sees it: through the input
        norm (q) or the context norm (k, v), where the layer has one (``kernel``: as :meth:`Norm.apply`)."""
        if which not in ("q", "k", "v"):
            raise ValueError(f"which must be 'q', 'k' or 'v', got which={which!r}")
        norm = self.input_norm if which == "q" else self.context_norm
        return x if norm is None else norm.apply(x, kernel=kernel)

    def _norm(self, which: str) -> Norm | None:
        return {"q": self.q_norm, "k": self.k_norm, "v": self.v_norm}[which]

    def projected(self, y: torch.Tensor, which: str) -> torch.Tensor:
        """A projection ("q", "k" or "v") (..., L, n * Hd) before the split: its "all" norm applied."""
        norm = self._norm(which)
        return norm.apply(y) if norm is not None and norm.over == "all" else y

    def split(self, y: torch.Tensor, which: str, head: int | None = None) -> torch.Tensor:
        """Heads (..., n, L, Hd), or head ``head`` alone (..., L, Hd), with their per-head norm, and
        rotary for q and k."""
        norm = self._norm(which)
        if norm is not None and norm.over == "head":
            y = norm.apply(y, head)
        return self.rotary.apply(y) if self.rotary is not None and which != "v" else y

    def scores(self, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """(..., Lq, Lk) scores of heads q (..., Lq, Hd), k (..., Lk, Hd) already split: scale, cap, bias.

        q is scaled before the product, as SDPA's math path does: (q k^T) * scale overflows float16
        at scores of 65504 before the scale brings them back (inputs of magnitude ~80 at Hd = 128),
        where the float64 oracle and any pre-scaling layer stay finite."""
        scale = 1.0 / math.sqrt(q.shape[-1]) if self.scale is None else self.scale
        s = (q * scale) @ k.transpose(-2, -1)
        if self.softcap is not None:
            s = torch.tanh(s / self.softcap) * self.softcap
        return s if bias is None else s + bias

    def keep(self, lq: int, lk: int, causal: bool | str, device: torch.device | None = None) -> torch.Tensor | None:
        """The window's keep-mask (Lq, Lk) (True = inside), or None without a window.

        ``causal`` (False, True = "top_left", or "bottom_right": :data:`mha.masks.CAUSAL_ALIGNMENTS`) places
        query i at key position i, or i + Lk - Lq bottom-right, the window ending there."""
        if self.window is None:
            return None
        i = torch.arange(lq, device=device)[:, None]
        j = torch.arange(lk, device=device)[None, :]
        if not causal:
            return (i - j).abs() < self.window
        at = i + causal_offset(lq, lk, causal)  # (Lq, 1): each query's own key position
        return (j > at - self.window) & (j <= at)


TEXTBOOK = Scoring()
