"""Shrinking stops after the runner's budget of steps: the verdict is then the last genuine
failure, never the signal that stopped Hypothesis (nor a timeout that reads as a hang), the
example database stores that very counterexample, and the counterexample does not depend on
how fast the machine is; a wall-clock safety net, when it fires, says so."""

from __future__ import annotations

import itertools
import types

import pytest
from hypothesis import Phase
from hypothesis import settings as Settings
from hypothesis.database import InMemoryExampleDatabase

from mha_verify.properties.engine import profiles, runner
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import Target
from tests.mutants import ScaleBySqrtDModel

# each test sets the shrink budget it is about (tests/conftest.py stops every other test at its first failure)
pytestmark = pytest.mark.shrinks


def _run(budget: float, monkeypatch: pytest.MonkeyPatch, settings: Settings, *, seconds_per_reading: float = 1.0,
         safety: float = 1e9) -> tuple[CheckResult, int]:
    built = 0
    build = Target.build

    def counted(self: Target, *args: object, **kwargs: object) -> object:
        nonlocal built
        built += 1
        return build(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "SHRINK_STEPS", budget)
    monkeypatch.setattr(runner, "SHRINK_SAFETY_SECONDS", safety)
    ticks = itertools.count()  # a clock that advances a fixed time per reading: a fast or a slow machine
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(
        perf_counter=lambda: seconds_per_reading * float(next(ticks))))
    monkeypatch.setattr(Target, "build", counted)
    target = Target("tests.mutants:ScaleBySqrtDModel", ScaleBySqrtDModel)
    result = runner.run_property(all_properties()["oracle_agreement"], target, settings=settings, seed=0)
    return result, built


@pytest.mark.deep
def test_a_spent_budget_ends_shrinking_with_the_genuine_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    db = InMemoryExampleDatabase()
    with_db = Settings(profiles.PROFILES["ci"], derandomize=False, database=db)
    spent, spent_builds = _run(6, monkeypatch, with_db)  # a few shrink steps, then spent
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
    replayed, _ = _run(6, monkeypatch, Settings(with_db, phases=[Phase.reuse]))
    assert replayed.verdict == "fail" and replayed.counterexample == spent.counterexample, (replayed, spent)


@pytest.mark.deep
def test_the_counterexample_does_not_depend_on_the_machines_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ci run on a machine whose every clock reading is 1 s apart and on one where they are
    100 s apart (a forward 100 times slower): the same counterexample, no safety-net remark."""
    fast, _ = _run(20, monkeypatch, profiles.PROFILES["ci"], seconds_per_reading=1.0)
    slow, _ = _run(20, monkeypatch, profiles.PROFILES["ci"], seconds_per_reading=100.0)
    assert fast.verdict == slow.verdict == "fail"
    assert fast.counterexample == slow.counterexample and fast.counterexample, (fast, slow)
    assert "safety net" not in (fast.reason or "") + (slow.reason or "")


def test_the_safety_net_says_when_it_fired(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped, _ = _run(10**9, monkeypatch, profiles.PROFILES["ci"], seconds_per_reading=100.0, safety=150.0)
    assert stopped.verdict == "fail" and stopped.counterexample
    assert "safety net" in (stopped.reason or "") and "depends on the machine's speed" in (stopped.reason or "")


@pytest.mark.serial
@pytest.mark.deep  # two gate runs, one with every forward slowed by 20 ms (tox -e deep)
def test_a_slowed_forward_prints_the_same_ci_counterexample(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real time, no mocked clock: the ci counterexample of a layer is the same when each of its
    forward calls sleeps 20 ms (shrinking is counted in steps; the 45 s safety net does not fire)."""
    from mha_verify.properties.targets.eager import load_target

    results = []
    for sleep in ("0", "0.02"):
        monkeypatch.setenv("MHA_VERIFY_TEST_SLEEP", sleep)
        results.append(runner.run_property(all_properties()["oracle_agreement"],
                                           load_target("tests/fixtures/slow_layer.py:SlowScaleBug"),
                                           settings=profiles.PROFILES["ci"]))
    fast, slow = results
    assert fast.verdict == slow.verdict == "fail", (fast, slow)
    assert fast.counterexample == slow.counterexample and fast.counterexample, (fast, slow)
    assert slow.seconds > fast.seconds
