"""What a layer's attributes say about the attention it computes: its softmax scale, logit softcap,
position bias, dropout, whether it returns weights, and its layer type in the config.
"""

from __future__ import annotations

import inspect
import math

from torch import nn

from mha_verify.mha.scoring import PositionBias

#: attributes where layers keep their dropout (Seed-OSS applies ``residual_dropout`` to its output
#: inside the layer)
DROPOUT_ATTRS = ("dropout", "attn_dropout", "dropout_p", "attention_dropout", "attn_pdrop", "residual_dropout")
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
    """Every (submodule, attribute) holding a dropout probability: a float, or the integer 0 (AltCLIP's text
    config writes its ``attention_probs_dropout_prob`` as ``0``, and its layer passes it to SDPA)."""
    found = []
    for sub in module.modules():
        for attr in DROPOUT_ATTRS:
            value = sub.__dict__.get(attr)
            if (isinstance(value, float) or (isinstance(value, int) and value == 0)) and not isinstance(value, bool):
                found.append((sub, attr))
    return found


#: the config fields transformers documents as the dropout of the attention probabilities (216, 31 and
#: 4 layers of transformers 5.24.0 copy them, in this order of frequency)
CONFIG_DROPOUT_FIELDS = ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop")


def is_probability(value: object) -> bool:
    """A number in [0, 1), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < 1.0


def set_all_dropout(module: nn.Module, p: float) -> bool:
    """Set every dropout probability ``module`` holds to ``p``: nn.Dropout modules and float
    attributes (``dropout``, ``attn_dropout``, ``dropout_p``, ``attention_dropout``,
    ``attn_pdrop``, ``residual_dropout``, which layers pass to ``F.dropout`` or SDPA's ``dropout_p``),
    and the attention dropout of a config a module holds (:data:`CONFIG_DROPOUT_FIELDS`: Data2Vec's
    vision layer passes ``self.config.attention_probs_dropout_prob`` to SDPA at every call), as a user of
    its library sets it. False if none."""
    found = False
    for sub in module.modules():
        config = sub.__dict__.get("config")
        for field in CONFIG_DROPOUT_FIELDS:
            if config is not None and is_probability(getattr(config, field, None)):
                setattr(config, field, float(p))
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
