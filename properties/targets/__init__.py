"""Eager targets: a torch module bound to the target protocol through its adapter.

Public API: :func:`load_target` (``FILE.py:NAME``, ``module:NAME`` or None for the reference)
returns a :class:`Target`, whose ``bind`` gives a :class:`Bound` instance to check.
"""

from mha_verify.properties.targets.eager import Bound, Target, load_target

__all__ = ["Bound", "Target", "load_target"]
