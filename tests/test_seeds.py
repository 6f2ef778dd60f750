"""Seeds: every (property, phase) draws from its own fixed seed, derandomized or from the
user's --seed, and a seeded run draws the same examples again."""

from __future__ import annotations

import pytest

from mha_verify.properties import profiles, runner
from mha_verify.properties.registry import all_properties
from mha_verify.properties.targets import load_target


def test_each_property_and_phase_has_its_own_seed() -> None:
    names, phases = list(all_properties()), ("random", "lk=33", "heads=(8, 16)")
    for user_seed in (None, 0, 7):
        seeds = {runner.phase_seed(n, p, user_seed) for n in names for p in phases}
        assert len(seeds) == len(names) * len(phases), user_seed
    assert runner.phase_seed("oracle_agreement", "random", 0) != runner.phase_seed("oracle_agreement", "random", 1)


CHECK = runner._check_example  # wrapped afresh by each run below, never a wrapper of a wrapper


def _drawn(seed: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def recorded(prop, target, dtype, stats, ex):  # type: ignore[no-untyped-def]
        seen.append(ex.describe())
        CHECK(prop, target, dtype, stats, ex)

    monkeypatch.setattr(runner, "_check_example", recorded)
    settings = profiles.PROFILES["quick"]
    result = runner.run_property(all_properties()["determinism"], load_target(), settings=settings, seed=seed)
    assert result.verdict == "pass", result
    return seen


def test_a_user_seed_draws_the_same_examples_again(monkeypatch: pytest.MonkeyPatch) -> None:
    first, again, other = (_drawn(s, monkeypatch) for s in (3, 3, 4))
    assert first == again and len(first) >= 20
    assert first != other
