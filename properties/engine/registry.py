"""The registry of named checks: invariants of one target (:class:`Property`) and relations
between two targets on the same example (:class:`Relation`). Each invariant module registers
its checks here; :mod:`mha_verify.properties.invariants.suite` imports them all."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from mha_verify.properties.engine.applicable import examples_for
from mha_verify.properties.engine.measure import CheckFn, RelationFn
from mha_verify.properties.protocol import LAWS_ONLY, Conventions
from mha_verify.properties.strategies.examples import AttnExample

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
    needs_grads: bool = False  # n/a for targets that declare grads=False (an onnxruntime session)
    needs_dropout: bool = False  # n/a for targets that declare dropout=False
    causal_forbids: str | None = None  # why causality forbids it (n/a for causal targets), or None
    # "full": every size case, swept; "modest": MODEST_CASES (several passes per example); "lengths":
    # MODEST_CASES, then the sweep of every length and batch boundary (not the wide-head cases, D up to 1024)
    reach: str = "modest"
    # holds the layer against the oracle (its formula, its weights, its projections): n/a for a layer
    # taking a step the oracle does not model (``Conventions.beyond``)
    needs_oracle: bool = False

    def beyond_oracle(self, conv: Conventions) -> str | None:
        """Why this check cannot hold a layer taking steps beyond the oracle, or None."""
        if self.needs_oracle and conv.beyond:
            # one reason for every such check: the report says it once, naming them all
            return (f"{LAWS_ONLY}: it takes {conv.beyond}, a step beyond the attention the oracle models: the checks "
                    "against the oracle are n/a; the laws are checked, each allowance measured against its own "
                    "float64 forward")
        return None

    def not_applicable(self, conv: Conventions) -> str | None:
        """Why this property cannot apply to a target of these conventions, decided before the run."""
        if self.needs_grads and conv.grads_refused:
            return f"inherited from a function the layer calls, which takes no gradients here: {conv.grads_refused}"
        if self.needs_grads and not conv.grads:
            return "the target declares no gradients (e.g. an onnxruntime session)"
        if self.needs_dropout and not conv.dropout:
            return "the target declares no dropout to control"
        if self.causal_forbids and conv.causal:
            return f"the target is causal: {self.causal_forbids}"
        if self.dtype == torch.float64 and conv.dtype is not None and conv.dtype != torch.float64:
            return f"it runs in float64, and the target computes in {str(conv.dtype).replace('torch.', '')} only"
        return self.beyond_oracle(conv)

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.check.__doc__ or "")

    @property
    def summary(self) -> str:
        return self.doc.splitlines()[0] if self.doc else self.name


PROPERTIES: dict[str, Property] = {}


def invariant(name: str, strategy: StrategyFn | None = None, dtype: torch.dtype = torch.float32, *,
              needs_grads: bool = False, needs_dropout: bool = False, causal_forbids: str | None = None,
              reach: str = "modest", needs_oracle: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register ``check`` as the property ``name`` (default examples: :func:`examples_for`).

    ``needs_grads``, ``needs_dropout``, ``causal_forbids`` and ``needs_oracle`` declare when the property
    cannot apply, so the runner decides it from the target's conventions before running.
    ``reach="full"``: the property gets every size case of the strategies and the runner's
    boundary sweep (the properties that see block-boundary bugs); "modest" keeps sizes that
    several forward passes per example can afford; "lengths" draws modest sizes and sweeps every
    length and batch boundary (a backward pass at D = 1024 costs more than its boundaries tell).
    """
    if reach not in ("full", "modest", "lengths"):
        raise ValueError(f"reach must be 'full', 'modest' or 'lengths', got reach={reach!r}")

    def register(check: CheckFn) -> CheckFn:
        if name in PROPERTIES:
            raise ValueError(f"property {name!r} is registered twice")
        PROPERTIES[name] = Property(name, check, strategy or (lambda conv: examples_for(conv, dtype=dtype)), dtype,
                                    needs_grads, needs_dropout, causal_forbids, reach, needs_oracle)
        return check

    return register


@dataclass(frozen=True)
class Relation:
    """A named relation between two targets on one example: ``check(first, second, example)``
    returns a Measure or raises a Violation (e.g. an onnxruntime session against the eager
    module it was exported from). Examples are drawn for the first target's conventions."""

    name: str
    check: RelationFn
    strategy: StrategyFn
    reach: str = "full"

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.check.__doc__ or "")


RELATIONS: dict[str, Relation] = {}


def relation(name: str, strategy: StrategyFn, *, reach: str = "full") -> Callable[[RelationFn], RelationFn]:
    """Register ``check`` as the relation ``name``."""
    if reach not in ("full", "modest"):
        raise ValueError(f"reach must be 'full' or 'modest', got reach={reach!r}")

    def register(check: RelationFn) -> RelationFn:
        if name in RELATIONS or name in PROPERTIES:
            raise ValueError(f"check {name!r} is registered twice")
        RELATIONS[name] = Relation(name, check, strategy, reach)
        return check

    return register
