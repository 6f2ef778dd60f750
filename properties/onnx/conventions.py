"""Conventions across the eager/ONNX boundary: an exported model states its conventions in its
metadata, only an eager target can state some of them (rotary, soft-cap, window, ALiBi, shared
keys and values), and an interface adopts those its model file carries.
"""

from __future__ import annotations

import dataclasses

from mha_verify.mha.masks import causal_word
from mha_verify.mha.rotary import Rotary
from mha_verify.properties.onnx.interface import Interface
from mha_verify.properties.protocol import Conventions

#: conventions only an eager target states (no file or flag does): keys and values in one argument,
#: rotary embeddings (``base;interleaved;fraction;reverse``), soft-cap, sliding window, ALiBi
EAGER_ONLY = ("kv_shared", "rotary", "softcap", "window", "alibi")


def adopt_conventions(info: Interface, conventions: dict[str, str], source: str) -> Interface:
    """``info`` with the ``fully_masked`` / ``causal`` / ``scale`` of ``conventions`` (the eager target's) where
    the file and the declarations state none, and its :data:`EAGER_ONLY` ones: one declaration serves
    both sides."""
    adopted = dict(info.conventions)
    for key in ("fully_masked", "causal", "scale", *EAGER_ONLY):
        if key not in adopted and key in conventions:
            adopted[key] = (conventions[key], source)
    return dataclasses.replace(info, conventions=adopted)


def eager_conventions(conv: Conventions) -> dict[str, str]:
    """An eager target's conventions in :func:`adopt_conventions`' vocabulary."""
    out = {"fully_masked": conv.fully_masked, "causal": causal_word(conv.causal)}
    if conv.scale is not None:
        out["scale"] = repr(float(conv.scale))
    if conv.kv_shared:
        out["kv_shared"] = "true"
    if conv.rotary is not None:
        out["rotary"] = conv.rotary.text()
    if conv.softcap is not None:
        out["softcap"] = repr(float(conv.softcap))
    if conv.window is not None:
        out["window"] = str(int(conv.window))
    if conv.position_bias is not None and conv.position_bias.alibi:
        out["alibi"] = "true"
    return out


def rotary_from(text: str) -> Rotary:
    """:func:`eager_conventions`' ``rotary`` text -> a Rotary (ValueError for any other text)."""
    return Rotary.parse(text)
