"""Adapters: how a foreign attention layer is called and where its weights are.

Public API: subclass :class:`Adapter` (or a builtin one: :class:`ByShapeAdapter` reads the weights and
conventions as for any layer, and a subclass need only say how to call a layer that takes another input
shape) and :func:`register` it; the registry
(``registry``) is tried in order, with the structural adapters (``structural``, ``projections``)
last. The other modules read what a layer states: its call signature (``signature``), its
forward's source (``forward_source``, ``library_facts``), its attributes (``layer_attrs``), its
rotary and QK-norms (``rotary_reading``, ``qk_norm``), and how to build it (``construction``).
"""

from mha_verify.properties.adapters.base import Adapter
from mha_verify.properties.adapters.by_shape import ByShapeAdapter
from mha_verify.properties.adapters.registry import register

__all__ = ["Adapter", "ByShapeAdapter", "register"]
