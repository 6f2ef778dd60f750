"""The engine: runs a property or relation on a target through Hypothesis and measures it
(``runner``, ``measure``, ``call_path``, ``applicable``, ``registry``), and keeps what it found
(``results``, ``databases``, ``keyed_database``, ``profiles``). It sees targets only through
the protocol.

Public API: :func:`run_property` and :func:`run_relation`.
"""

from mha_verify.properties.engine.runner import run_property, run_relation

__all__ = ["run_property", "run_relation"]
