"""What a layer should compute, as its library declares it: the spec its code is held to.

A value read from the layer's own code (its ``scaling`` attribute, say) is a convention only where
its library declares nothing. Where the library declares the value — in the config the layer is
built from, or in a convention it documents, kept here as data with where it is written — the
declared value is what the oracle applies, and a reading that departs from it is a *departure*:
named in the layer's conventions and in every failure of a check against the oracle. A wrong
scale then fails ("its code scales scores by 0.25 where 1/sqrt(head_dim 4) = 0.5"), instead of
passing as the layer's convention.

Declared so far, for transformers layers: the softmax scale, the direction its rotary turns and
the attention dropout its config holds. A transformers attention layer scales
its scores by 1/sqrt(head_dim) unless its config says otherwise (``query_pre_attn_scalar``,
``attention_multiplier``, ``scale_attn_weights``) or its model family documents another scale
(:data:`HF_SCALE_FAMILIES`); where the config sets a scale the rules here do not compute (YaRN's
``mscale``, a scale divided by the layer's index), nothing is declared and the code's reading
stands, said as read from the code.

A transformers rotary turns forward — ``rotate_half(x) = cat(-x2, x1)``, or the same over
neighbouring pairs — in every family but those of :data:`HF_REVERSE_ROTARY`; which columns pair is
still read from the layer's own functions. A transformers config's attention dropout
(``layer_attrs.CONFIG_DROPOUT_FIELDS``) is a promise that in training the attention weights are
dropped: a layer that holds the probability and never drops is a failure, not an argument it
ignores — unless the layer refuses the field above 0 when it is built (DiffLlama), which is its
library saying so.
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from mha_verify.properties.adapters.construction import constructor_signature
from mha_verify.properties.adapters.layer_attrs import CONFIG_DROPOUT_FIELDS, is_probability

#: transformers model families (the folder under ``transformers/models/``) whose layers scale their
#: scores by other than 1/sqrt(head_dim) with no config field saying so: family -> (rule, where the
#: library says it, transformers 5.24.0). Rules: "one" (no scale), "inverse_head_dim" (1/head_dim),
#: "inverse_sqrt_half_head_dim" (1/sqrt(head_dim / 2)).
HF_SCALE_FAMILIES: dict[str, tuple[str, str]] = {
    # T5 and its descendants do not scale: Mesh TensorFlow folds 1/sqrt(d) into the query
    # projection's initialization ("# Mesh TensorFlow initialization to avoid scaling before softmax")
    **{family: ("one", f"{family}/modeling_{family}.py: T5's unscaled scores (Mesh TensorFlow initialization)")
       for family in ("t5", "mt5", "umt5", "longt5", "switch_transformers", "pop2piano", "udop", "pix2struct")},
    # Gemma 3n and 4 normalize q and k (RMSNorm) and leave the temperature to the norms' gains
    **{family: ("one", f"{family}/modeling_{family}.py: `self.scaling = 1.0` beside its QK-norm")
       for family in ("gemma3n", "gemma4", "gemma4_unified", "diffusion_gemma", "embedding_gemma2")},
    "dia": ("one", "dia/modeling_dia.py:270: `self.scaling = 1`"),
    "inkling": ("inverse_head_dim", "inkling/modeling_inkling.py:189: q/k RMS-normalized per head, hence 1/d"),
    "zamba": ("inverse_sqrt_half_head_dim", "zamba/modeling_zamba.py:138: `(self.head_dim / 2) ** -0.5`"),
    "zamba2": ("inverse_sqrt_half_head_dim", "zamba2/modeling_zamba2.py:239: `(self.head_dim / 2) ** -0.5`"),
}


#: transformers families whose rotary turns the other way (``rotate_half`` returning ``cat(x2, -x1)``):
#: family -> where the library says so (transformers 5.24.0)
HF_REVERSE_ROTARY: dict[str, str] = {
    "nanochat": "nanochat/modeling_nanochat.py:167: `rotate_half` returns `torch.cat((x2, -x1), dim=-1)`",
}

@dataclass(frozen=True)
class Declared:
    """A value the layer's library declares, and where it says so (for the report)."""

    value: float
    how: str


def hf_family(module: nn.Module) -> str | None:
    """The transformers model family ``module``'s class belongs to (``llama`` for
    ``transformers.models.llama.modeling_llama``), or None for a class outside transformers."""
    parts = type(module).__module__.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["transformers", "models"] else None


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def declared_scale(module: nn.Module, head_dim: int) -> Declared | None:
    """The softmax scale ``module``'s library declares for it at head width ``head_dim`` (the width the
    harness built it with, read from its weights), or None where it declares none."""
    family = hf_family(module)
    config = getattr(module, "config", None)
    if family is None or config is None or head_dim <= 0:
        return None
    if family in HF_SCALE_FAMILIES:
        rule, where = HF_SCALE_FAMILIES[family]
        value = {"one": 1.0, "inverse_head_dim": 1.0 / head_dim,
                 "inverse_sqrt_half_head_dim": (head_dim / 2) ** -0.5}[rule]
        return Declared(value, f"{value:.6g}, its family's documented scale (transformers {where})")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) is True:
        return None  # GPT-2's option: divided by the layer's index too, not computed here
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and any(k in rope for k in ("mscale", "mscale_all_dim")):
        return None  # YaRN's mscale (DeepSeek V2/V3) multiplies the scale: not computed here
    scalar = _number(getattr(config, "query_pre_attn_scalar", None))
    if scalar is not None:
        return Declared(scalar ** -0.5, f"1/sqrt({scalar:g}) = {scalar ** -0.5:.6g} from its config's "
                                        "query_pre_attn_scalar")
    multiplier = _number(getattr(config, "attention_multiplier", None))
    if multiplier is not None:
        return Declared(multiplier, f"{multiplier:.6g} from its config's attention_multiplier")
    if getattr(config, "scale_attn_weights", True) is False:
        return Declared(1.0, "1 from its config's scale_attn_weights=False")
    return Declared(head_dim ** -0.5, f"1/sqrt(head_dim {head_dim}) = {head_dim ** -0.5:.6g}, transformers' "
                                      "scaled dot-product attention (no config field sets another)")


def scale_departure(read: float | None, read_how: str, declared: Declared, head_dim: int) -> str | None:
    """The words of a departure where the scale read from the code (None: 1/sqrt(head_dim), the
    contract) is not the declared one; None where they agree."""
    value = head_dim ** -0.5 if read is None else read
    if math.isclose(value, declared.value, rel_tol=1e-6):
        return None
    said = read_how or f"1/sqrt(head_dim {head_dim})"
    return f"its code scales scores by {value:.6g} ({said}) where its spec says {declared.how}"


def declared_reverse(module: nn.Module) -> tuple[bool, str] | None:
    """(whether ``module``'s rotary turns the other way, where its library says so), or None where its
    library declares no direction (a class outside transformers)."""
    family = hf_family(module)
    if family is None:
        return None
    if family in HF_REVERSE_ROTARY:
        return True, f"its family's rotary turns the other way (transformers {HF_REVERSE_ROTARY[family]})"
    return False, "transformers' rotary turns forward (`rotate_half(x) = cat(-x2, x1)`)"


def rotary_departure(read_reverse: bool, read_how: str, declared: tuple[bool, str]) -> str | None:
    """The words of a departure where the rotary's direction read from the code is not the declared one."""
    if read_reverse == declared[0]:
        return None
    turns = "the other way" if read_reverse else "forward"
    return f"its code turns its rotary {turns} ({read_how}) where its spec says {declared[1]}"


def declared_dropout(module: nn.Module) -> str | None:
    """The attention dropout ``module``'s library declares for it, in words (the config field), or None:
    for a transformers layer whose config holds a field of ``CONFIG_DROPOUT_FIELDS``, unless building
    the layer with that field above 0 raises (:func:`_refuses_dropout`)."""
    family = hf_family(module)
    config = getattr(module, "config", None)
    if family is None or config is None:
        return None
    field = next((f for f in CONFIG_DROPOUT_FIELDS if is_probability(getattr(config, f, None))), None)
    if field is None or _refuses_dropout(type(module), config, field):
        return None
    return f"its config's {field} ({type(config).__name__})"


_REFUSES: dict[tuple[type, str], bool] = {}


def _refuses_dropout(cls: type, config: object, field: str) -> bool:
    """Whether ``cls`` built from ``config`` with ``field`` = 0.1 raises ValueError (DiffLlama's "does
    not support `attention_dropout > 0`"). Only a constructor that takes the config and, at most, a
    layer index is built; any other is not (False: its config's promise stands)."""
    key = (cls, field)
    if key not in _REFUSES:
        params = {name: p for name, p in constructor_signature(cls).parameters.items()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        required = [name for name, p in params.items() if p.default is p.empty]
        refused = False
        if "config" in required and set(required) <= {"config", "layer_idx"}:
            changed = copy.deepcopy(config)
            setattr(changed, field, 0.1)
            with contextlib.suppress(Exception):  # any other error is not a refusal: the promise stands
                try:
                    cls(config=changed, **({"layer_idx": 0} if "layer_idx" in params else {}))
                except ValueError:
                    refused = True
        _REFUSES[key] = refused
    return _REFUSES[key]


#: constructor parameters by which a layer's caller chooses its role (a decoder's causal self-attention,
#: an encoder's or a cross-attention): where the class takes one, the instance built is the role asked
#: for, and its library declares nothing more about it
_ROLE_PARAMETERS = ("is_causal", "causal", "is_decoder")


@dataclass(frozen=True)
class DeclaredCausal:
    """A self-attention layer of a decoder-only model: causal, by its library's declaration (``how``);
    ``unmasked``: its model calls it with no mask on a batch without padding (transformers'
    ``create_causal_mask`` under sdpa), its own causal flag then deciding."""

    how: str
    unmasked: bool


_CAUSAL: weakref.WeakKeyDictionary[nn.Module, DeclaredCausal | None] = weakref.WeakKeyDictionary()


def declared_causal(module: nn.Module) -> DeclaredCausal | None:
    """:func:`_declared_causal`, read once per layer (a layer's conventions are read at every call)."""
    if module not in _CAUSAL:
        _CAUSAL[module] = _declared_causal(module)
    return _CAUSAL[module]


def _declared_causal(module: nn.Module) -> DeclaredCausal | None:
    """Causality ``module``'s library declares for it, or None: a transformers layer whose config's model type
    its library lists as a causal language model (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), and neither as a
    masked one nor as a sequence-to-sequence one, built as self-attention (its class takes no argument that
    chooses its role, and is not built as cross-attention)."""
    config = getattr(module, "config", None)
    model_type = getattr(config, "model_type", None)
    if hf_family(module) is None or not isinstance(model_type, str) or getattr(config, "is_encoder_decoder", False):
        return None
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        return None
    lists = {name: getattr(modeling_auto, name, {}) for name in (
        "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
        "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES")}
    causal_lm = lists["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"].get(model_type)
    if causal_lm is None or any(model_type in lists[n] for n in lists if n != "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"):
        return None
    params = constructor_signature(type(module)).parameters
    if any(p in params for p in _ROLE_PARAMETERS) or module.__dict__.get("is_cross_attention") is True:
        return None
    how = (f"causal: transformers lists {model_type!r} as a causal language model ({causal_lm}) and no masked or "
           "sequence-to-sequence one")
    return DeclaredCausal(how, _model_passes_no_mask(config))


def _model_passes_no_mask(config: object) -> bool:
    """Whether transformers' ``create_causal_mask`` gives no mask for ``config`` on a batch of 3 tokens without
    padding (sdpa skips it, and the layer's ``is_causal`` decides); False where it gives one or cannot tell."""
    try:
        from transformers.masking_utils import create_causal_mask

        width = getattr(config, "hidden_size", None)
        embeds = torch.zeros(1, 3, width if isinstance(width, int) and width > 0 else 8)
        return create_causal_mask(config=config, inputs_embeds=embeds, attention_mask=None, cache=None) is None
    except Exception:  # another version's signature, a config it cannot read: the mask is passed, as before
        return False


def causal_departure(read: bool | str, read_how: str, declared: DeclaredCausal) -> str | None:
    """The words of a departure where the layer's code reads not causal and its library declares it causal."""
    if read:
        return None
    return f"its code is not causal ({read_how}) where its spec says {declared.how}"


def declared_norm(module: nn.Module) -> tuple[str, float, str] | None:
    """(kind, eps, in words) of the QK-norm ``module``'s library declares, or None: a transformers layer whose
    config states ``rms_norm_eps`` and no ``layer_norm_eps`` (RMSNorm), or the other way round (LayerNorm).
    Consulted only where a norm child computes no formula the oracle knows: a child that computes one is
    held to what it computes."""
    config = getattr(module, "config", None)
    if hf_family(module) is None or config is None:
        return None
    rms, layer = _number(getattr(config, "rms_norm_eps", None)), _number(getattr(config, "layer_norm_eps", None))
    if rms is not None and layer is None:
        return "rms", rms, f"RMSNorm, eps {rms:g}, from its config's rms_norm_eps"
    if layer is not None and rms is None:
        return "layer", layer, f"LayerNorm, eps {layer:g}, from its config's layer_norm_eps"
    return None
