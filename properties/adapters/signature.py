"""How a foreign layer wants to be called, read from the *names* in its ``forward`` signature.

Roles are found by name, never by counting positional parameters:
``forward(self, x, mask=None, need_weights=False)`` has three, yet is not ``forward(q, k, v)``.

* the input: ``x``, ``hidden_states``, ``input``, ``inputs``, ``query``, ``q`` (the first
  parameter if none of these: a layer's first argument is its input);
* keys and values: ``key``/``value`` or ``k``/``v`` (cross-attention, q/k/v layers), or one
  ``context``/``y``/``encoder_hidden_states``/``key_value_states``/``memory``/``kv``/``xa`` (keys =
  values, as x-transformers, torchtune, diffusers and HF cross-attention take them); neither:
  self-attention only;
* the mask: ``attn_mask``, ``attention_mask`` or ``mask`` (first found), else a key-padding mask
  ``key_padding_mask`` (B, Lk), True = padded, as torch's, else key padding as lengths (``lengths``,
  ``seq_lens``, ...: (B,) valid keys per item, right padding only); a mask parameter without a default is
  given None when there is no mask;
* any other parameter without a default, unless annotated as a tensor alone, is given None (a position
  or mask of its own that the layer takes as "none given"; only in a library the harness has no facts
  about, ``structural.given_none``), and the conventions say so.

Mask *polarity* is never read from outputs: it comes from a :class:`MaskFormat` that a known
adapter states, or a declaration; unknown layers get SDPA's (bool True = keep, float additive).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mha_verify.mha.masks import additive_mask, causal_keep, forms_within
from mha_verify.properties.adapters.mask_convert import to_kind, to_shape
from mha_verify.properties.protocol import NotApplicable

INPUT_NAMES = ("x", "hidden_states", "input", "inputs", "query", "q")
KV_PAIRS = (("key", "value"), ("k", "v"))
CONTEXT_NAMES = ("context", "y", "encoder_hidden_states", "key_value_states", "memory", "kv", "xa")
MASK_NAMES = ("attn_mask", "attention_mask", "mask")
PADDING_NAMES = ("key_padding_mask",)
#: key padding given as each item's number of valid keys (B,): right padding, and nothing else, can be said so
LENGTH_NAMES = ("lengths", "seq_lens", "seq_lengths", "lens", "key_lengths", "src_lengths", "valid_lens",
                "valid_lengths", "input_lengths")


@dataclass(frozen=True)
class Signature:
    """The roles of a forward's parameters, by name (None: the layer has no such parameter)."""

    input: str
    key: str | None = None
    value: str | None = None
    context: str | None = None
    mask: str | None = None
    padding: str | None = None
    need_weights: bool = False
    rotary: str | None = None  # HF's position_embeddings: (cos, sin), required by Llama-style layers
    mask_required: bool = False  # the mask parameter has no default (GPT-NeoX's attention_mask)
    position_bias: str | None = None  # HF T5's additive position bias, computed by the layer when not given
    context_mask: str | None = None  # BERT-style layers mask cross-attention with encoder_attention_mask
    lengths: bool = False  # the mask is key padding given as lengths (B,) (:data:`LENGTH_NAMES`)
    #: parameters with no default and no role above (vit-pytorch's ``rotary_emb, pos, block_mask``): given None
    unnamed_required: tuple[str, ...] = ()
    #: a rotary's tables handed in by the caller as two required arguments ``cos, sin`` (kornia's vision
    #: layers): given a rotation by 0
    tables: tuple[str, str] | None = None
    #: the positions of the queries (``position_ids``, (B, L)), from which a layer computes a rotary of its own
    positions: str | None = None

    @property
    def self_attention(self) -> bool:
        return self.key is None and self.context is None


def read_signature(module: nn.Module) -> Signature:
    """The roles in ``module.forward``'s signature, decided from parameter names only."""
    forward = module.forward
    return _roles(getattr(forward, "__func__", forward))  # read once per forward function


@functools.lru_cache(maxsize=256)
def _roles(forward: Callable[..., Any]) -> Signature:
    params = inspect.signature(forward).parameters
    names = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if names and names[0] in ("self", "cls"):  # the function, not the bound method: its first is the module
        names = names[1:]
    first = next((n for n in INPUT_NAMES if n in names), names[0] if names else "x")
    key = value = context = None
    for k, v in KV_PAIRS:
        if k in names and v in names:
            key, value = k, v
            break
    else:
        context = next((n for n in CONTEXT_NAMES if n in names), None)
    padding = next((n for n in PADDING_NAMES if n in names), None)
    # a forward whose only mask is key padding (fairseq-style, speech layers) is masked through it
    mask = next((n for n in MASK_NAMES if n in names), padding)
    lengths = mask is None and any(n in names for n in LENGTH_NAMES)
    if lengths:
        mask = next(n for n in LENGTH_NAMES if n in names)
    rotary = "position_embeddings" if "position_embeddings" in names else None
    required = mask is not None and params[mask].default is params[mask].empty
    bias = "position_bias" if "position_bias" in names else None
    context_mask = "encoder_attention_mask" if context is not None and "encoder_attention_mask" in names else None
    tables = ("cos", "sin") if all(n in names and params[n].default is params[n].empty for n in ("cos", "sin")) \
        else None
    positions = "position_ids" if "position_ids" in names else None
    roles = {first, key, value, context, mask, padding, rotary, bias, context_mask, positions, *(tables or ())}
    unnamed = tuple(n for n in names if n not in roles and params[n].default is params[n].empty
                    and not _tensor_only(params[n].annotation))
    return Signature(first, key, value, context, mask, padding, "need_weights" in names, rotary, required, bias,
                     context_mask, lengths, unnamed, tables, positions)


def _tensor_only(annotation: object) -> bool:
    """A parameter annotated as a tensor and nothing else (``h: torch.Tensor``, also as a string): None is
    not a value it takes (labml's retro cross-attention takes its queries' input second, so annotated)."""
    if isinstance(annotation, str):
        return annotation.strip() in ("torch.Tensor", "Tensor")
    return annotation is torch.Tensor


@dataclass(frozen=True)
class MaskFormat:
    """How a layer wants its mask: what it means and what shape it has.

    kind: "keep" (bool True = may attend, SDPA), "drop" (bool True = masked out, torch MHA),
        "additive" (float, -inf removes), "additive_min" (float, HF's finfo(dtype).min for a
        removed key: fully masked rows then get uniform weights).
    takes: the mask types converted to ``kind`` without loss ("bool", "float").
    layout: "BHLL" (any shape broadcasting to (B, H, Lq, Lk), passed as is), "BHLL4" (the same at
        rank 4 only: diffusers' dispatch reads a 2-D mask as key padding (B, Lk)), "BLL" (no head
        axis: (B, Lq, Lk), torchtune), "BL" (key padding (B, Lk), x-transformers' ``mask``), "B1LL"
        (exactly (B, 1, Lq, Lk): HF's older layers, BART's copies such as LED's decoder, compare the
        mask's size to that and raise on any other), "BHLL3" (exactly (B * H, Lq, Lk), the heads
        folded into the batch: Mask2Former's and OneFormer's DETR-style layers), "LL" (one (Lq, Lk)
        mask for every item and head: whisper's classic path), "LLB" ((Lq, Lk, B), batch last, no head
        axis: labml's sequence-first layers), "LEN" (key padding as lengths (B,), long: the keys before
        position lengths[b] are kept, those from it on removed; a mask that is not right padding has no such
        form, and is NotApplicable).
    """

    kind: str = "keep"
    takes: frozenset[str] = frozenset({"bool", "float"})
    layout: str = "BHLL"

    @property
    def carried(self) -> tuple[bool, bool, bool, bool]:
        """Which of (B, H, Lq, Lk) the layout carries at full size."""
        return {"BHLL": (True, True, True, True), "BHLL4": (True, True, True, True), "BLL": (True, False, True, True),
                "BL": (True, False, False, True), "B1LL": (True, False, True, True),
                "BHLL3": (True, True, True, True), "LL": (False, False, True, True),
                "LLB": (True, False, True, True), "LEN": (True, False, False, True)}[self.layout]

    @property
    def forms(self) -> frozenset[str]:
        """The mask forms (Conventions.mask_forms) this layout can carry."""
        forms = forms_within(self.carried)
        return forms - {"LL"} if self.layout == "BHLL4" else forms

    def describe(self) -> str:
        what = {"keep": "bool True = may attend", "drop": "bool True = masked out",
                "additive": "additive float, -inf removes", "additive_min": "additive float, finfo.min removes"}
        shape = {"BHLL": "", "BHLL4": ", of rank 4", "BLL": ", shaped (B, Lq, Lk)", "BL": ", key padding (B, Lk)",
                 "B1LL": ", shaped (B, 1, Lq, Lk) exactly", "BHLL3": ", shaped (B * H, Lq, Lk)",
                 "LL": ", one (Lq, Lk) mask for every item and head", "LLB": ", shaped (Lq, Lk, B), batch last",
                 "LEN": ", as lengths (B,) of kept keys (right padding only)"}
        return f"mask passed as {what[self.kind]}{shape[self.layout]}"

    def convert(self, mask: torch.Tensor | None, *, B: int, Lq: int, Lk: int, dtype: torch.dtype,
                causal: bool | str = False, heads: int | None = None) -> torch.Tensor | None:
        """Our mask (None, bool keep-mask or additive float, broadcasting to (B, H, Lq, Lk)) ->
        the layer's, with the layer's causality (True = "top_left", or "bottom_right") ANDed in when
        ``causal`` (layers that take a mask apply it instead of their own causality, as torchtune and
        HF eager do)."""
        if causal:
            causal_mask = causal_keep(Lq, Lk, mask.device if mask is not None else None, align=causal)  # (Lq, Lk)
            if mask is None:
                mask = causal_mask
            elif mask.dtype == torch.bool:
                mask = mask & causal_mask
            else:
                bias = additive_mask(causal_mask, mask.dtype)
                assert bias is not None
                mask = mask + bias
        if mask is None:
            return None
        if self.layout == "LEN":
            return lengths_of(mask, B=B, Lk=Lk)
        if self.layout == "BHLL4" and mask.dim() == 2:  # the causal (Lq, Lk) alone: not key padding
            mask = mask[None, None]
        elif self.layout == "B1LL":
            mask = to_shape(mask, (B, 1, Lq, Lk), self.carried, what="a layer whose mask has one head")
        elif self.layout == "LLB":
            mask = to_shape(mask, (B, 1, Lq, Lk), self.carried, what="a layer whose mask has no head axis")
            mask = mask[:, 0].permute(1, 2, 0)  # (B, 1, Lq, Lk) -> (Lq, Lk, B)
        elif self.layout == "BHLL3":
            if heads is None:
                raise ValueError("a mask of layout BHLL3 needs the number of heads: convert(..., heads=H)")
            mask = to_shape(mask, (B, heads, Lq, Lk), self.carried).reshape(B * heads, Lq, Lk)
        elif self.layout not in ("BHLL", "BHLL4"):  # no head axis: (B, Lq, Lk) (torchtune) or key padding (B, Lk)
            H = mask.shape[1] if mask.dim() == 4 else 1
            rank = tuple(i for i, kept in enumerate(self.carried) if kept)
            mask = to_shape(mask, (B, H, Lq, Lk), self.carried, rank, what="a layer whose mask has no head axis")
        return to_kind(mask, self.kind, dtype, takes=self.takes)




def lengths_of(mask: torch.Tensor, *, B: int, Lk: int) -> torch.Tensor:
    """Our mask (bool keep-mask or additive float, broadcasting to (B, H, Lq, Lk)) as the lengths (B,)
    of its kept keys, where it is right padding; NotApplicable where it is not (keys removed in some
    other place, per query or per head, or a finite bias on a kept key)."""
    keep = to_kind(mask, "keep", torch.float32, takes=frozenset({"bool"}))
    keep = to_shape(keep, (B, 1, 1, Lk), (True, False, False, True), (0, 3), what="a layer taking lengths")  # (B, Lk)
    lengths = keep.sum(-1)  # (B,)
    if not bool(torch.equal(keep, torch.arange(Lk, device=keep.device)[None, :] < lengths[:, None])):
        raise NotApplicable("the layer takes key padding as lengths (B,), and this mask is not right padding")
    return lengths.long()


#: how a layer whose only mask is given as lengths takes it (:func:`lengths_of`)
LENGTHS = MaskFormat(kind="keep", takes=frozenset({"bool"}), layout="LEN")

#: how a forward whose only mask is ``key_padding_mask`` takes it: torch's meaning (True = padded key), (B, Lk)
KEY_PADDING = MaskFormat(kind="drop", takes=frozenset({"bool"}), layout="BL")


def first_output(out: Any) -> torch.Tensor:
    """The output tensor of a forward that returns it alone or first in a tuple."""
    return out[0] if isinstance(out, (tuple, list)) else out


def is_same_input(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return q is k is v or (q.shape == k.shape == v.shape and bool(torch.equal(q, k)) and bool(torch.equal(k, v)))

