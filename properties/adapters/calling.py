"""How a foreign layer wants to be called, read from the *names* in its ``forward`` signature.

Roles are found by name, never by counting positional parameters:
``forward(self, x, mask=None, need_weights=False)`` has three, yet is not ``forward(q, k, v)``.

* the input: ``x``, ``hidden_states``, ``input``, ``inputs``, ``query``, ``q`` (the first
  parameter if none of these: a layer's first argument is its input);
* keys and values: ``key``/``value`` or ``k``/``v`` (cross-attention, q/k/v layers), or one
  ``context``/``y``/``encoder_hidden_states``/``key_value_states``/``memory``/``kv`` (keys =
  values, as x-transformers, torchtune, diffusers and HF cross-attention take them); neither:
  self-attention only;
* the mask: ``attn_mask``, ``attention_mask`` or ``mask`` (first found), or a key-padding mask
  ``key_padding_mask``; a mask parameter without a default is given None when there is no mask.

Mask *polarity* is never read from outputs: it comes from a :class:`MaskFormat` that a known
adapter states, or a declaration; unknown layers get SDPA's (bool True = keep, float additive).
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mha_verify.mha.masks import additive_mask, causal_keep, forms_within
from mha_verify.mha.rotary import Rotary
from mha_verify.mha.scoring import PositionBias
from mha_verify.properties.adapters.mask_convert import to_kind, to_shape

INPUT_NAMES = ("x", "hidden_states", "input", "inputs", "query", "q")
KV_PAIRS = (("key", "value"), ("k", "v"))
CONTEXT_NAMES = ("context", "y", "encoder_hidden_states", "key_value_states", "memory", "kv")
MASK_NAMES = ("attn_mask", "attention_mask", "mask")
PADDING_NAMES = ("key_padding_mask",)
#: (Seed-OSS applies ``residual_dropout`` to its attention output inside the layer)
DROPOUT_ATTRS = ("dropout", "attn_dropout", "dropout_p", "attention_dropout", "attn_pdrop", "residual_dropout")


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
    first = next((n for n in INPUT_NAMES if n in names), names[0] if names else "x")
    key = value = context = None
    for k, v in KV_PAIRS:
        if k in names and v in names:
            key, value = k, v
            break
    else:
        context = next((n for n in CONTEXT_NAMES if n in names), None)
    mask = next((n for n in MASK_NAMES if n in names), None)
    padding = next((n for n in PADDING_NAMES if n in names), None)
    rotary = "position_embeddings" if "position_embeddings" in names else None
    required = mask is not None and params[mask].default is params[mask].empty
    bias = "position_bias" if "position_bias" in names else None
    context_mask = "encoder_attention_mask" if context is not None and "encoder_attention_mask" in names else None
    return Signature(first, key, value, context, mask, padding, "need_weights" in names, rotary, required, bias,
                     context_mask)


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
        folded into the batch: Mask2Former's and OneFormer's DETR-style layers).
    """

    kind: str = "keep"
    takes: frozenset[str] = frozenset({"bool", "float"})
    layout: str = "BHLL"

    @property
    def carried(self) -> tuple[bool, bool, bool, bool]:
        """Which of (B, H, Lq, Lk) the layout carries at full size."""
        return {"BHLL": (True, True, True, True), "BHLL4": (True, True, True, True), "BLL": (True, False, True, True),
                "BL": (True, False, False, True), "B1LL": (True, False, True, True),
                "BHLL3": (True, True, True, True)}[self.layout]

    @property
    def forms(self) -> frozenset[str]:
        """The mask forms (Conventions.mask_forms) this layout can carry."""
        forms = forms_within(self.carried)
        return forms - {"LL"} if self.layout == "BHLL4" else forms

    def describe(self) -> str:
        what = {"keep": "bool True = may attend", "drop": "bool True = masked out",
                "additive": "additive float, -inf removes", "additive_min": "additive float, finfo.min removes"}
        shape = {"BHLL": "", "BHLL4": ", of rank 4", "BLL": ", shaped (B, Lq, Lk)", "BL": ", key padding (B, Lk)",
                 "B1LL": ", shaped (B, 1, Lq, Lk) exactly", "BHLL3": ", shaped (B * H, Lq, Lk)"}
        return f"mask passed as {what[self.kind]}{shape[self.layout]}"

    def convert(self, mask: torch.Tensor | None, *, B: int, Lq: int, Lk: int, dtype: torch.dtype,
                causal: bool = False, heads: int | None = None) -> torch.Tensor | None:
        """Our mask (None, bool keep-mask or additive float, broadcasting to (B, H, Lq, Lk)) ->
        the layer's, with top-left causality ANDed in when ``causal`` (layers that take a mask
        apply it instead of their own causality, as torchtune and HF eager do)."""
        if causal:
            causal_mask = causal_keep(Lq, Lk, mask.device if mask is not None else None)  # (Lq, Lk)
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
        if self.layout == "BHLL4" and mask.dim() == 2:  # the causal (Lq, Lk) alone: not key padding
            mask = mask[None, None]
        elif self.layout == "B1LL":
            mask = to_shape(mask, (B, 1, Lq, Lk), self.carried, what="a layer whose mask has one head")
        elif self.layout == "BHLL3":
            if heads is None:
                raise ValueError("a mask of layout BHLL3 needs the number of heads: convert(..., heads=H)")
            mask = to_shape(mask, (B, heads, Lq, Lk), self.carried).reshape(B * heads, Lq, Lk)
        elif self.layout not in ("BHLL", "BHLL4"):  # no head axis: (B, Lq, Lk) (torchtune) or key padding (B, Lk)
            H = mask.shape[1] if mask.dim() == 4 else 1
            rank = tuple(i for i, kept in enumerate(self.carried) if kept)
            mask = to_shape(mask, (B, H, Lq, Lk), self.carried, rank, what="a layer whose mask has no head axis")
        return to_kind(mask, self.kind, dtype, takes=self.takes)


def _lower_triangular(t: torch.Tensor) -> bool:
    if t.dim() < 2 or t.shape[-1] != t.shape[-2] or t.shape[-1] < 2 or t.dtype.is_complex:
        return False
    m = t.reshape(-1, t.shape[-2], t.shape[-1])[0] != 0
    return bool(torch.equal(m, torch.tril(torch.ones_like(m))))


_SDPA_CAUSAL = re.compile(r"is_causal\s*=\s*True")


_CAUSAL_SEEN: weakref.WeakKeyDictionary[nn.Module, tuple[bool, str]] = weakref.WeakKeyDictionary()


def detect_causal(module: nn.Module) -> tuple[bool, str]:
    """(causal, how we know) for ``module``, found once per instance (:func:`_detect_causal`).

    Cached: reading a buffer's values is data-dependent, which torch's exporters cannot
    trace, and a layer's structure does not change between calls.
    """
    if module not in _CAUSAL_SEEN:
        _CAUSAL_SEEN[module] = _detect_causal(module)
    return _CAUSAL_SEEN[module]


def _detect_causal(module: nn.Module) -> tuple[bool, str]:
    """(causal, how we know), from the layer's structure, never its outputs.

    In order: a bool ``is_causal`` attribute (HF, torchtune), a bool ``causal`` attribute
    (x-transformers), a lower-triangular buffer (nanoGPT's ``bias`` on its slow path), a
    forward whose source calls SDPA with ``is_causal=True`` (nanoGPT's flash path), or a
    diffusers processor (``module.processor``) whose ``__call__`` does.
    """
    for attr in ("is_causal", "causal"):
        value = getattr(module, attr, None)
        if isinstance(value, bool):
            return value, f"causal from its {attr}={value} attribute"
    for name, buf in module.named_buffers(recurse=False):
        if _lower_triangular(buf):
            return True, f"causal from its lower-triangular buffer {name!r}"
    for where, source in forward_sources(module):
        if _SDPA_CAUSAL.search(source):
            return True, f"causal from is_causal=True in {where}"
    return False, "not causal (no is_causal/causal attribute, no triangular buffer)"


def own_causal_mask(module: nn.Module) -> bool:
    """Whether the layer masks the future itself with a lower-triangular buffer of its own (GPT-2's
    older code, ImageGPT's ``bias``), on top of any mask it is given."""
    return any(_lower_triangular(buf) for _, buf in module.named_buffers(recurse=False))


def forward_sources(module: nn.Module) -> tuple[tuple[str, str], ...]:
    """(where, source text) of the layer's forward and of a diffusers processor's ``__call__``
    (the layer's forward hands the work to it); "" where the source cannot be read."""
    processor = getattr(module, "processor", None)
    call = type(processor).__call__ if processor is not None and callable(processor) else None
    return _sources(type(module).forward, call)


@functools.lru_cache(maxsize=256)
def _sources(forward: Callable[..., Any], call: Callable[..., Any] | None) -> tuple[tuple[str, str], ...]:
    """Read once per (forward, processor call): conventions are asked for at every call of a layer."""
    out = []
    for where, fn in (("its forward", forward), ("its processor", call)):
        try:
            out.append((where, inspect.getsource(fn) if fn is not None else ""))
        except (OSError, TypeError):
            out.append((where, ""))
    return tuple(out)


#: attributes where layers keep the softmax scale they apply: HF's ``self.scaling`` (passed to
#: every attention implementation), diffusers' and timm's ``self.scale``
SCALE_ATTRS = ("scaling", "scale")


def layer_scale(module: nn.Module, head_dim: int) -> tuple[float | None, str]:
    """(the softmax scale ``module`` states, how we know), or (None, "") where it states none or
    1 / sqrt(head_dim), the contract. Read from a number attribute (:data:`SCALE_ATTRS`; Dia's is
    the int 1), never from outputs: a layer that states one scale and applies another is then a
    finding."""
    for attr in SCALE_ATTRS:
        value = module.__dict__.get(attr)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            value = float(value)
            if math.isclose(value, head_dim ** -0.5, rel_tol=1e-6):
                return None, ""
            return value, f"softmax scale {value:.6g} from its {attr} attribute"
    return None, ""


SOFTCAP_ATTRS = ("attn_logit_softcapping", "softcap", "logit_softcapping")


def layer_softcap(module: nn.Module) -> tuple[float | None, str]:
    """(the logit soft-cap ``module`` or its config states, how we know), or (None, "") (Gemma 2's
    ``attn_logit_softcapping``)."""
    config = getattr(module, "config", None)
    for owner, where in ((module, "its"), (config, "its config's")):
        for attr in SOFTCAP_ATTRS:
            value = getattr(owner, attr, None) if owner is not None else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
                return float(value), f"logits soft-capped at {float(value):g} ({where} {attr})"
    return None, ""


def layer_position_bias(module: nn.Module) -> PositionBias | None:
    """The additive position bias a layer computes itself (T5's ``compute_bias(Lq, Lk)`` where
    ``has_relative_attention_bias``), as a table the oracle adds; None without one."""
    compute = getattr(module, "compute_bias", None)
    if getattr(module, "has_relative_attention_bias", False) is not True or not callable(compute):
        return None
    try:  # LongT5's local layers take compute_bias(block_length): no (Lq, Lk) table
        inspect.signature(compute).bind(1, 1)
    except (TypeError, ValueError):
        return None
    return PositionBias(table=lambda lq, lk: compute(lq, lk), source=f"{type(module).__name__}.compute_bias")


def returns_weights(module: nn.Module) -> bool:
    """An HF layer running its eager code returns its attention weights (B, H, Lq, Lk) second."""
    config = getattr(module, "config", None)
    return type(module).__module__.startswith("transformers.") and \
        getattr(config, "_attn_implementation", None) == "eager"


def dropout_attrs(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """Every (submodule, attribute) holding a dropout probability as a float."""
    found = []
    for sub in module.modules():
        for attr in DROPOUT_ATTRS:
            value = sub.__dict__.get(attr)
            if isinstance(value, float) and not isinstance(value, bool):
                found.append((sub, attr))
    return found


def set_all_dropout(module: nn.Module, p: float) -> bool:
    """Set every dropout probability ``module`` holds to ``p``: nn.Dropout modules and float
    attributes (``dropout``, ``attn_dropout``, ``dropout_p``, ``attention_dropout``,
    ``attn_pdrop``, ``residual_dropout``, which layers pass to ``F.dropout`` or SDPA's ``dropout_p``).
    False if none."""
    found = False
    for sub in module.modules():
        if isinstance(sub, nn.modules.dropout._DropoutNd):
            sub.p = p
            found = True
    for sub, attr in dropout_attrs(module):
        setattr(sub, attr, float(p))
        found = True
    return found


def has_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in module.modules()) or bool(dropout_attrs(module))


def layer_type_of(module: nn.Module) -> str | None:
    """The layer's type where its config gives each layer one (Gemma 3's ``layer_types``:
    "sliding_attention" or "full_attention", each with its own rotary), else None."""
    own = getattr(module, "layer_type", None)
    if isinstance(own, str):
        return own
    types_, idx = getattr(getattr(module, "config", None), "layer_types", None), getattr(module, "layer_idx", None)
    if isinstance(types_, (list, tuple)) and isinstance(idx, int) and 0 <= idx < len(types_):
        return str(types_[idx])
    return None


def rotary_of(config: object, layer_type: str | None = None) -> tuple[Rotary | None, str]:
    """(the rotary embeddings an HF config describes, how we know) or (None, why not).

    transformers 5.x keeps them in ``rope_parameters`` (``rope_theta``, ``rope_type``,
    ``partial_rotary_factor``), 4.x in ``rope_theta`` and ``rope_scaling``. Only the default
    rope type is the formula of :class:`mha.rotary.Rotary`; scaled types (linear, dynamic, yarn,
    llama3, longrope) change the frequencies, and are left out (identity rotation) with a note.
    The layout is halves here; the layer's own is read by :mod:`properties.rotary_reading`.
    """
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]  # Gemma 3: one set of rotary parameters per layer type
    if isinstance(params, dict) and "rope_theta" in params:
        theta, rope_type = params.get("rope_theta"), params.get("rope_type", "default")
        fraction = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    else:
        scaling = getattr(config, "rope_scaling", None)
        theta = getattr(config, "rope_theta", None)
        rope_type = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else "default"
        fraction = getattr(config, "partial_rotary_factor", 1.0)
    if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        return None, "rotary replaced by a rotation by 0: no rope_theta in its config"
    if rope_type not in (None, "default"):
        return None, f"rotary replaced by a rotation by 0: rope type {rope_type!r} is not the default formula"
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        return None, f"rotary replaced by a rotation by 0: partial_rotary_factor={fraction!r}"
    rotary = Rotary(float(theta), False, float(fraction))
    return rotary, f"{rotary.describe()} (its config)"


def library_rotary(module: nn.Module) -> nn.Module | None:
    """The layer's library's own rotary embedding (``LlamaRotaryEmbedding(config)``: a class named
    ``*RotaryEmbedding`` in the layer's module), built from the layer's config; None if none
    builds. Its cos and sin are what the model would give the layer, so they are verified too.

    Built at every call, never kept: one built while an exporter traces holds fake tensors.
    """
    config = getattr(module, "config", None)
    namespace = vars(sys.modules.get(type(module).__module__, types.ModuleType("none")))
    candidates = sorted((c for name, c in namespace.items() if name.endswith("RotaryEmbedding")
                         and inspect.isclass(c) and issubclass(c, nn.Module)), key=lambda c: c.__name__)
    for cls in candidates if config is not None else ():
        try:
            return cls(config=config)
        except Exception:
            continue
    return None


def rotary_cos_sin(emb: nn.Module, module: nn.Module, x: torch.Tensor,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the library's rotary embedding ``emb`` for ``module``: with its layer type where
    the embedding's forward takes one (Gemma 3's ``forward(x, position_ids, layer_type)``)."""
    if "layer_type" in inspect.signature(emb.forward).parameters:
        cos, sin = emb(x, positions, layer_type_of(module))
    else:
        cos, sin = emb(x, positions)
    return cos, sin


def position_embeddings(module: nn.Module, x: torch.Tensor, rotary: Rotary | None,
                        head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``position_embeddings`` (cos, sin), each (B, L, r), for positions 0 .. L-1 of x (B, L, D):
    from the library's own rotary embedding where there is one, else in its layout
    (the angles repeated over both halves); a rotation by 0 where ``rotary`` is None."""
    if rotary is None:
        return identity_rotary(x, head_dim)
    B, L = x.shape[0], x.shape[1]
    positions = torch.arange(L, device=x.device)[None].expand(B, L)
    emb = library_rotary(module)
    if emb is not None:
        return rotary_cos_sin(emb, module, x, positions)
    r = rotary.dims(head_dim)
    inv_freq = 1.0 / rotary.base ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)  # (B, L, r/2)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def identity_rotary(x: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``position_embeddings`` (cos, sin) of a rotation by 0: RoPE leaves q and k unchanged.

    Rotary position encoding is outside the attention formula we verify; with cos = 1 and
    sin = 0, ``apply_rotary_pos_emb`` is the identity and the layer is plain attention.
    """
    B, L = x.shape[0], x.shape[1]
    return (torch.ones(B, L, head_dim, dtype=x.dtype, device=x.device),
            torch.zeros(B, L, head_dim, dtype=x.dtype, device=x.device))


def first_output(out: Any) -> torch.Tensor:
    """The output tensor of a forward that returns it alone or first in a tuple."""
    return out[0] if isinstance(out, (tuple, list)) else out


def is_same_input(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return q is k is v or (q.shape == k.shape == v.shape and bool(torch.equal(q, k)) and bool(torch.equal(k, v)))


__all__ = [
    "MaskFormat",
    "Signature",
    "detect_causal",
    "dropout_attrs",
    "first_output",
    "forward_sources",
    "has_dropout",
    "identity_rotary",
    "is_same_input",
    "layer_position_bias",
    "layer_scale",
    "layer_softcap",
    "layer_type_of",
    "library_rotary",
    "own_causal_mask",
    "position_embeddings",
    "read_signature",
    "returns_weights",
    "rotary_cos_sin",
    "rotary_of",
    "set_all_dropout",
]
