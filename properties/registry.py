"""The registry of named invariants; each invariant module registers its properties here."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from properties.adapters import Conventions
from properties.checks import CheckFn, examples_for
from properties.strategies import AttnExample

StrategyFn = Callable[[Conventions], "st.SearchStrategy[AttnExample] | str"]


@dataclass(frozen=True)
class Property:
    """A named invariant: ``check(bound, example)`` returns a Measure or raises a Violation.

    ``strategy(conventions)`` gives the examples for a target, or a str: why the property
    cannot apply to it. ``dtype`` is the precision the target is built in.
    """

    name: str
    check: CheckFn
    strategy: StrategyFn
    dtype: torch.dtype = torch.float32

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.check.__doc__ or "")

    @property
    def summary(self) -> str:
        return self.doc.splitlines()[0] if self.doc else self.name


PROPERTIES: dict[str, Property] = {}


def invariant(name: str, strategy: StrategyFn | None = None, dtype: torch.dtype = torch.float32
              ) -> Callable[[CheckFn], CheckFn]:
    """Register ``check`` as the property ``name`` (default examples: :func:`examples_for`)."""

    def register(check: CheckFn) -> CheckFn:
        if name in PROPERTIES:
            raise ValueError(f"property {name!r} is registered twice")
        PROPERTIES[name] = Property(name, check, strategy or (lambda conv: examples_for(conv, dtype=dtype)), dtype)
        return check

    return register


def all_properties() -> dict[str, Property]:
    """Every property, in registration order (imports the invariant modules)."""
    from properties import invariants_behaviour, invariants_mask, invariants_oracle, invariants_symmetry  # noqa: F401

    return PROPERTIES
