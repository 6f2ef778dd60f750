"""The invariants of multi-head attention, one module per family (``oracle``, ``mask``, ``causal``,
``window``, ``grad``, ``layout``, ``modes``, ``symmetry``, ``behaviour``), the metamorphic
relations (``relations``), and the suite that registers them in order (``suite``).

Public API: :func:`all_properties` and :func:`all_relations`.
"""

from mha_verify.properties.invariants.suite import all_properties, all_relations

__all__ = ["all_properties", "all_relations"]
