"""The gate's unit of work, as data: built by the CLI layer, run by :mod:`mha_verify.isolation`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One unit of the gate's work: ``mha_verify.gate.<fn>(**kwargs)``, reported as ``name`` in ``stage``.

    ``examples``: the Hypothesis examples it runs (its timeout grows with them; None: the
    profile's count); ``timeout_factor``: a multiple of that timeout, for tasks that do more
    than run examples (an export and the validation of its model).
    """

    name: str
    stage: str
    fn: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    examples: int | None = None
    timeout_factor: float = 1.0
