"""Every registered check: the invariants of one target and the relations between two.

Importing this module imports each invariant module, which registers its checks in
:mod:`mha_verify.properties.engine.registry`; the registry itself imports none of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from mha_verify.properties.engine.registry import PROPERTIES, RELATIONS, Property, Relation
from mha_verify.properties.invariants import (  # noqa: F401 -- imported for their registrations
    behaviour,
    causal,
    decode,
    dropout,
    grad,
    layout,
    mask,
    modes,
    oracle,
    relations,
    symmetry,
    window,
)


def all_properties() -> dict[str, Property]:
    """Every property, in registration order."""
    return PROPERTIES


def all_relations() -> dict[str, Relation]:
    """Every relation between two targets, in registration order."""
    return RELATIONS


def select(names: Iterable[str] | None) -> list[Property]:
    """The properties named (all by default); ValueError naming the unknown ones."""
    props = all_properties()
    if not names:
        return list(props.values())
    chosen = list(names)
    unknown = [n for n in chosen if n not in props]
    if unknown:
        raise ValueError(f"unknown properties {', '.join(unknown)}; known: {', '.join(props)}")
    return [props[n] for n in chosen]
