"""Bug-finding power: each one-bug mutant of the reference is caught by the expected property."""

from __future__ import annotations

import pytest

from properties import profiles
from properties.registry import all_properties
from properties.runner import run_property
from properties.targets import Target
from tests.mutants import CATALOG

SETTINGS = profiles.PROFILES[profiles.profile_name()]


@pytest.mark.parametrize("mutant", list(CATALOG))
def test_mutant_is_caught(mutant: str) -> None:
    cls, expected = CATALOG[mutant]
    target = Target(f"tests.mutants:{cls.__name__}", cls)
    result = run_property(all_properties()[expected], target, settings=SETTINGS)
    assert result.verdict == "fail", f"{mutant} escaped {expected}: {result}"
    assert result.counterexample and result.reason
