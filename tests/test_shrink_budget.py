"""Shrinking stops after the runner's budget: the verdict is then the last genuine failure,
never the signal that stopped Hypothesis (nor a timeout that reads as a hang)."""

from __future__ import annotations

import pytest

from properties import profiles, runner
from properties.registry import all_properties
from properties.targets import Target
from tests.mutants import ScaleBySqrtDModel


def _run(budget: float, monkeypatch: pytest.MonkeyPatch) -> tuple[object, int]:
    calls = 0
    check = runner._check_example

    def counted(*args: object) -> None:
        nonlocal calls
        calls += 1
        check(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "SHRINK_BUDGET", budget)
    monkeypatch.setattr(runner, "_check_example", counted)
    target = Target("tests.mutants:ScaleBySqrtDModel", ScaleBySqrtDModel)
    result = runner.run_property(all_properties()["oracle_agreement"], target, settings=profiles.PROFILES["ci"])
    return result, calls


def test_a_spent_budget_ends_shrinking_with_the_genuine_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    spent, spent_calls = _run(0.0, monkeypatch)
    full, full_calls = _run(1e9, monkeypatch)
    for result in (spent, full):
        assert result.verdict == "fail"  # type: ignore[attr-defined]
        assert result.reason.startswith("output vs float64 oracle"), result.reason  # type: ignore[attr-defined]
        assert result.counterexample  # type: ignore[attr-defined]
        assert result.worst_error > result.allowed  # type: ignore[attr-defined]
    # with no budget left, each later call returns at once: far fewer examples reach the check
    assert spent_calls < full_calls, (spent_calls, full_calls)
