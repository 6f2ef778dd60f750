"""Seeds: every (property, phase) draws from its own fixed seed, derandomized or from the
user's --seed, and a seeded run draws the same examples again."""

from __future__ import annotations

from mha_verify.properties.engine import profiles, runner
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target


def test_each_property_and_phase_has_its_own_seed() -> None:
    names, phases = list(all_properties()), ("random", "lk=33", "heads=(8, 16)")
    for user_seed in (None, 0, 7):
        seeds = {runner.phase_seed(n, p, user_seed) for n in names for p in phases}
        assert len(seeds) == len(names) * len(phases), user_seed
    assert runner.phase_seed("oracle_agreement", "random", 0) != runner.phase_seed("oracle_agreement", "random", 1)


def _drawn(seed: int) -> list[str]:
    seen: list[str] = []
    settings = profiles.PROFILES["quick"]
    result = runner.run_property(all_properties()["determinism"], load_target(), settings=settings, seed=seed,
                                 observer=lambda ex, outcome: seen.append(ex.describe()))
    assert result.verdict == "pass", result
    assert result.examples == len(seen), "the observer sees every example the runner checked"
    return seen


def test_a_user_seed_draws_the_same_examples_again() -> None:
    first, again, other = (_drawn(s) for s in (3, 3, 4))
    assert first == again and len(first) >= 20
    assert first != other
