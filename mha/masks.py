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


def causal_keep(lq: int, lk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """bool (Lq, Lk): query i may attend to keys j <= i (top-left aligned, as SDPA's ``is_causal``)."""
    rows = torch.arange(lq, device=device).unsqueeze(-1)  # (Lq, 1)
    cols = torch.arange(lk, device=device)  # (Lk,)
    return cols <= rows


def kept_fraction(mask: torch.Tensor | None) -> float:
    """The fraction of (query, key) pairs kept (1.0 without a mask)."""
    keep = keep_mask(mask)
    return 1.0 if keep is None or keep.numel() == 0 else float(keep.float().mean())


__all__ = ["additive_mask", "causal_keep", "full_keep", "fully_masked_rows", "keep_mask", "kept_fraction",
           "rows_with_a_key"]
