"""Shrinking stops after the runner's budget: the verdict is then the last genuine failure,
never the signal that stopped Hypothesis (nor a timeout that reads as a hang), and the
example database stores that very counterexample."""

from __future__ import annotations

import itertools
import types

import pytest
from hypothesis import Phase
from hypothesis import settings as Settings
from hypothesis.database import InMemoryExampleDatabase

from mha_verify.properties import profiles, runner
from mha_verify.properties.results import CheckResult
from mha_verify.properties.suite import all_properties
from mha_verify.properties.targets import Target
from tests.mutants import ScaleBySqrtDModel


def _run(budget: float, monkeypatch: pytest.MonkeyPatch, settings: Settings) -> tuple[CheckResult, int]:
    built = 0
    build = Target.build

    def counted(self: Target, *args: object, **kwargs: object) -> object:
        nonlocal built
        built += 1
        return build(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "SHRINK_BUDGET", budget)
    ticks = itertools.count()  # a clock that advances one second per reading: no timing in the test
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    monkeypatch.setattr(Target, "build", counted)
    target = Target("tests.mutants:ScaleBySqrtDModel", ScaleBySqrtDModel)
    result = runner.run_property(all_properties()["oracle_agreement"], target, settings=settings, seed=0)
    return result, built


def test_a_spent_budget_ends_shrinking_with_the_genuine_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    db = InMemoryExampleDatabase()
    with_db = Settings(profiles.PROFILES["ci"], derandomize=False, database=db)
    spent, spent_builds = _run(6.0, monkeypatch, with_db)  # a few shrink steps, then spent
    full, full_builds = _run(1e9, monkeypatch, profiles.PROFILES["ci"])
    for result in (spent, full):
        assert result.verdict == "fail"
        assert result.reason and result.reason.startswith("output vs float64 oracle"), result.reason
        assert result.counterexample
        assert result.worst_error > result.allowed
        # Hypothesis's own reproduction blob is kept: its final replay of the counterexample
        # failed as before, rather than on a stop signal (which made the run "flaky" and lost it)
        assert "reproduce_failure" in str(result.details.get("hypothesis")), result.details
    # with no budget left, every later example is rejected before the layer is built
    assert spent_builds < full_builds, (spent_builds, full_builds)
    # what the database stored is the counterexample reported, and it fails again
    replayed, _ = _run(6.0, monkeypatch, Settings(with_db, phases=[Phase.reuse]))
    assert replayed.verdict == "fail" and replayed.counterexample == spent.counterexample, (replayed, spent)
