"""What a layer should compute, as its library declares it: the spec its code is held to.

A value read from the layer's own code (its ``scaling`` attribute, say) is a convention only where
its library declares nothing. Where the library declares the value — in the config the layer is
built from, or in a convention it documents, kept here as data with where it is written — the
declared value is what the oracle applies, and a reading that departs from it is a *departure*:
named in the layer's conventions and in every failure of a check against the oracle. A wrong
scale then fails ("its code scales scores by 0.25 where 1/sqrt(head_dim 4) = 0.5"), instead of
passing as the layer's convention.

Declared so far: the softmax scale of transformers layers. A transformers attention layer scales
its scores by 1/sqrt(head_dim) unless its config says otherwise (``query_pre_attn_scalar``,
``attention_multiplier``, ``scale_attn_weights``) or its model family documents another scale
(:data:`HF_SCALE_FAMILIES`); where the config sets a scale the rules here do not compute (YaRN's
``mscale``, a scale divided by the layer's index), nothing is declared and the code's reading
stands, said as read from the code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

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
