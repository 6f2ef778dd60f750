"""Hypothesis's walk of ``sys.modules``, kept off modules that raise when looked at.

To draw constants from the user's own code, Hypothesis reads ``module.__file__`` of every module new in
``sys.modules`` before it draws an input. A library's lazy module (one that imports its parts on
attribute access, as transformers' and others' do) can raise ImportError there, for a backend that is
not installed: the exception then surfaced from the draw, as if the target had raised it. The target's
own call is what imported that module; nothing is wrong with the target. Such modules are marked as
already seen, so the walk passes them by; the others are walked as before.
"""

from __future__ import annotations

import sys


def shield_module_walk() -> None:
    """Mark every module in ``sys.modules`` whose ``__file__`` lookup raises as walked for Hypothesis.

    Every module is looked at whose id Hypothesis has not seen (not only when ``sys.modules`` grew: a
    module replaced under its name leaves the length as it was)."""
    try:
        from hypothesis.internal.conjecture import providers

        seen = providers._seen_modules
    except (ImportError, AttributeError):  # another Hypothesis: no such walk to keep off them
        return
    for module in list(sys.modules.values()):
        if id(module) in seen:
            continue
        try:
            getattr(module, "__file__", None)
        except Exception:
            seen.add(id(module))


__all__ = ["shield_module_walk"]
