"""Mask semantics in one place: keep-masks, additive masks and fully masked rows.

Vocabulary used everywhere in this project:

* **keep-mask**: a bool tensor, True = this query may attend to this key (the convention of
  ``F.scaled_dot_product_attention``, of the ONNX ``Attention`` operator and of our reference).
* **additive mask**: a float tensor added to the scores; 0 keeps a key, -inf removes it, a
  finite value biases it. A finite value, however large and negative (``torch.finfo(dtype).min``,
  -1e4, -1e9 as HF transformers and fairseq write them), is a *bias*, not a removal: the key
  keeps a (tiny) weight, exactly as softmax computes it.
* **fully masked row**: a query row (of one head) whose keys are all removed. Our contract
  gives it zero weights, so its output is ``w_o(0) = b_o``.

Shapes: any mask broadcasts to (B, H, Lq, Lk); a key-padding mask is (B, 1, 1, Lk).
:class:`MaskForm` names the shapes; :data:`FULLY_MASKED` the conventions a layer may follow
on fully masked rows.
"""

from __future__ import annotations

import math
from enum import Enum

import torch

#: what a fully masked query row gives: "zeros" (our contract: zero weights, output w_o(0) = b_o),
#: "uniform" (weights 1/Lk over every key: layers that mask with finfo.min), "uniform_visible"
#: (weights spread over the keys the layer's own causal or window mask leaves: finfo.min added to a
#: causal finfo.min overflows to -inf there, ImageGPT's kind), "nan" (torch MHA)
FULLY_MASKED = ("zeros", "uniform", "uniform_visible", "nan")


class MaskForm(str, Enum):
    """A mask shape, by the axes it carries: each of (B, H, Lq, Lk) is full or 1, and "LL" is rank 2.

    The members' order is the order the strategies draw them in.
    """

    B1LL = "B1LL"  # (B, 1, Lq, Lk): per item, shared by the heads
    ONE_ONE_LL = "11LL"  # (1, 1, Lq, Lk): one mask for the whole batch
    LL = "LL"  # (Lq, Lk), rank 2
    BHLL = "BHLL"  # (B, H, Lq, Lk): per item and head
    B11L = "B11L"  # (B, 1, 1, Lk): key padding, one row of keys per item shared by every query

    def __str__(self) -> str:
        return self.value

    def shape(self, B: int, H: int, Lq: int, Lk: int) -> tuple[int, ...]:
        """The tensor shape of this form at these sizes."""
        full = {"B": B, "H": H, "Lq": Lq, "Lk": Lk}
        return tuple(full[a] if isinstance(a, str) else a for a in self.axes)

    @property
    def axes(self) -> tuple[str | int, ...]:
        """Per axis, its size's name or 1: ("B", 1, "Lq", "Lk") for B1LL; ("Lq", "Lk") for LL."""
        return _AXES[self.value]

    @property
    def spans(self) -> tuple[bool, bool, bool, bool]:
        """Which of (B, H, Lq, Lk) the form carries at full size."""
        named = {a for a in self.axes if isinstance(a, str)}
        return ("B" in named, "H" in named, "Lq" in named, "Lk" in named)


def forms_within(carried: tuple[bool, bool, bool, bool]) -> frozenset[str]:
    """The mask forms a target can take that carries the (B, H, Lq, Lk) axes marked True at full
    size and the others at 1: those that span no axis it lacks."""
    return frozenset(f.value for f in MaskForm
                     if not any(span and not has for span, has in zip(f.spans, carried, strict=True)))


_AXES: dict[str, tuple[str | int, ...]] = {
    "B1LL": ("B", 1, "Lq", "Lk"), "11LL": (1, 1, "Lq", "Lk"), "LL": ("Lq", "Lk"),
    "BHLL": ("B", "H", "Lq", "Lk"), "B11L": ("B", 1, 1, "Lk"),
}
MASK_FORMS: tuple[str, ...] = tuple(f.value for f in MaskForm)


def keep_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A keep-mask or additive mask -> bool keep-mask of the same shape (None stays None).

    Additive: a key is kept unless its bias is -inf (finite biases keep it).
    """
    if mask is None:
        return None
    return mask if mask.dtype == torch.bool else mask > -math.inf


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A keep-mask or additive mask -> additive mask of ``dtype`` (0 keeps, -inf removes).

    An additive mask is converted to ``dtype``; a bool keep-mask becomes 0 / -inf exactly.
    """
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -math.inf)
    return mask.to(dtype)


def full_keep(mask: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    """The keep-mask broadcast to ``shape`` (usually (B, H, Lq, Lk)); all True without a mask."""
    keep = keep_mask(mask)
    if keep is None:
        return torch.ones(shape, dtype=torch.bool)
    return keep.expand(shape)


def fully_masked_rows(mask: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    """bool (..., Lq) of ``shape[:-1]``: the query rows with every key removed."""
    return ~full_keep(mask, shape).any(dim=-1)


def rows_with_a_key(mask: torch.Tensor) -> torch.Tensor:
    """mask (..., Lq, Lk) -> bool (..., Lq, 1): True where the query row keeps at least one key.

    Works inside exported graphs (no data-dependent control flow).
    """
    keep = keep_mask(mask)
    assert keep is not None
    return keep.any(dim=-1, keepdim=True)


#: how a causal mask lines queries up with keys: "top_left" (query i sees keys j <= i: SDPA's
#: ``is_causal``, torch's ``causal_upper_left``) or "bottom_right" (query i sees keys
#: j <= i + Lk - Lq: the last query sees every key, as a KV-cache decode step or a chunked prefill
#: needs; flash-attention >= 2.1, torch's ``causal_lower_right``). With Lq = Lk they coincide.
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def causal_alignment(causal: bool | str | None) -> str | None:
    """A causal convention's value -> None (not causal), "top_left" or "bottom_right".

    False and None are not causal; True is "top_left" (what ``causal=True`` always meant). Anything
    else is a ValueError naming it.
    """
    if causal is None or causal is False:
        return None
    if causal is True:
        return "top_left"
    if isinstance(causal, str) and causal in CAUSAL_ALIGNMENTS:
        return causal
    raise ValueError(f"causal must be False, True (= 'top_left'), 'top_left' or 'bottom_right', got causal={causal!r}")


def causal_word(causal: bool | str) -> str:
    """A causal convention as the word an ONNX file's metadata and ``--conventions causal=`` use:
    "false", "true" (top-left, as ONNX's ``is_causal``) or "bottom_right"."""
    return {"top_left": "true", "bottom_right": "bottom_right"}.get(causal_alignment(causal) or "", "false")


def causal_offset(lq: int, lk: int, align: bool | str = "top_left") -> int:
    """How many keys past its own index query i sees: 0 top-left, Lk - Lq bottom-right (negative when Lq > Lk)."""
    alignment = causal_alignment(align)
    if alignment is None:
        raise ValueError(f"align must be 'top_left' or 'bottom_right', got align={align!r}")
    return lk - lq if alignment == "bottom_right" else 0


def causal_keep(lq: int, lk: int, device: torch.device | str | None = None, *,
                align: bool | str = "top_left") -> torch.Tensor:
    """bool (Lq, Lk), True = may attend: query i sees keys j <= i + offset.

    ``align`` (:data:`CAUSAL_ALIGNMENTS`; True is "top_left"): offset 0 top-left (SDPA's ``is_causal``),
    Lk - Lq bottom-right (torch's ``causal_lower_right``). Bottom-right with Lq > Lk leaves the first
    Lq - Lk query rows without any key: fully masked rows, which the layer's ``fully_masked``
    convention decides. Example: ``causal_keep(1, 3, align="bottom_right")`` is [[True, True, True]]
    (a decode step sees the whole cache), ``causal_keep(1, 3)`` is [[True, False, False]].
    """
    offset = causal_offset(lq, lk, align)
    rows = torch.arange(lq, device=device).unsqueeze(-1)  # (Lq, 1)
    cols = torch.arange(lk, device=device)  # (Lk,)
    return cols <= rows + offset


def kept_fraction(mask: torch.Tensor | None) -> float:
    """The fraction of (query, key) pairs kept (1.0 without a mask)."""
    keep = keep_mask(mask)
    return 1.0 if keep is None or keep.numel() == 0 else float(keep.float().mean())


__all__ = ["CAUSAL_ALIGNMENTS", "additive_mask", "causal_alignment", "causal_keep", "causal_offset", "causal_word",
           "full_keep", "fully_masked_rows", "keep_mask", "kept_fraction", "rows_with_a_key"]
