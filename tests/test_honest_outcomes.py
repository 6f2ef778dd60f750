"""An exception is the target's failure only where the target raised it; one raised by mha-verify's own
check is an error of the run: no verdict on the target, never a pass, and never exit 0.

The target's own code — its construction, forward, backward — runs under ``target_side``; everything
else a check does (its oracle, its comparison, Hypothesis's drawing) is mha-verify's.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from mha_verify.exit_codes import EXIT_ERROR, EXIT_FAIL, EXIT_OK, verdicts_exit
from mha_verify.properties.engine import profiles, registry
from mha_verify.properties.engine.applicable import examples_for
from mha_verify.properties.engine.measure import Measure
from mha_verify.properties.engine.registry import Property
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.model import runner as model_runner
from mha_verify.properties.protocol import Instance
from mha_verify.properties.strategies.examples import AttnExample
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/contract_breakers.py:"
QUICK = profiles.PROFILES["quick"]


def _indexes_past_its_output(bound: Instance, ex: AttnExample) -> Measure:
    """A check with a bug of its own: it calls the target, then indexes past the output's batch."""
    out = bound(ex.q, ex.k, ex.v, ex.mask)
    return Measure(float(out[out.shape[0]].abs().max()), 1.0)


BUGGY = Property("indexes_past_its_output", _indexes_past_its_output, lambda conv: examples_for(conv))


def test_an_exception_of_mha_verifys_check_is_an_error_not_the_targets_failure() -> None:
    result = run_property(BUGGY, load_target(), settings=QUICK)
    assert result.verdict == "error", result
    assert (result.reason or "").startswith("not the target's: mha-verify's check raised IndexError"), result.reason
    assert result.errored and not result.failed


def test_the_same_exception_raised_by_the_target_is_its_failure() -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + "RaisesIndexErrorPastFourKeys"),
                          settings=QUICK)
    assert result.verdict == "fail", result
    assert (result.reason or "").startswith("the target raised IndexError: position"), result.reason


def test_an_exception_in_the_targets_backward_is_its_failure() -> None:
    result = run_property(all_properties()["grad_agreement"], load_target(FIXTURE + "BackwardRaises"), settings=QUICK)
    assert result.verdict == "fail", result
    assert "the target raised RuntimeError: this kernel has no backward" in (result.reason or ""), result.reason


def _result(verdict: str) -> CheckResult:
    return CheckResult(verdict, "properties", verdict, reason="mha-verify's check raised IndexError: x"
                       if verdict == "error" else None)


@pytest.mark.parametrize(("verdicts", "code"), [
    (("pass", "error"), EXIT_ERROR),  # a pass beside an error is no green run
    (("pass", "error", "fail"), EXIT_FAIL),  # a defect found is the news; the error is still said
    (("error",), EXIT_ERROR),
    (("pass", "warn"), EXIT_OK),
    (("n/a", "warn"), EXIT_FAIL),  # nothing verified
])
def test_the_exit_code_of_a_run_with_an_error(verdicts: tuple[str, ...], code: int,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert verdicts_exit([_result(v) for v in verdicts]) == code
    err = capsys.readouterr().err
    assert ("mha-verify: error: properties/error: mha-verify's check raised IndexError" in err) == ("error" in verdicts)


def _whole_model(check: Callable[..., Measure]) -> tuple[SimpleNamespace, dict[str, Callable[..., Measure]]]:
    mut = SimpleNamespace(eager=SimpleNamespace(vocab_size=11, max_length=8, type_vocab_size=0),
                          needs_tokens=None, claims=lambda side: "", outside=lambda batch: "")
    return mut, {**model_runner.CHECKS, "outputs_agree": check}


def test_a_whole_model_check_that_raises_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check pairing outputs of different widths once raised IndexError and was reported as a warning:
    the run exited 0 with nothing compared."""
    def pairs_the_wrong_outputs(mut: object, batch: object) -> Measure:
        return Measure(float(torch.zeros(97)[torch.arange(64) + 64].sum()), 1.0)

    mut, checks = _whole_model(pairs_the_wrong_outputs)
    monkeypatch.setattr(model_runner, "CHECKS", checks)
    result = model_runner.run_check("outputs_agree", mut, QUICK)  # type: ignore[arg-type]
    assert result.verdict == "error", result
    assert "mha-verify's check raised IndexError" in (result.reason or ""), result.reason
    assert verdicts_exit([CheckResult("padding_invariance", "model", "pass", examples=5), result],
                         passing=("pass",)) == EXIT_ERROR


def test_check_exits_3_when_its_own_check_raises(monkeypatch: pytest.MonkeyPatch,
                                                 cli: Callable[..., object]) -> None:
    monkeypatch.setitem(registry.PROPERTIES, BUGGY.name, BUGGY)
    done = cli("check", "--no-isolation", "--no-export", "--profile", "quick",
               "--only", f"head_split,{BUGGY.name}")
    assert done.returncode == EXIT_ERROR, done.stdout + done.stderr  # type: ignore[attr-defined]
    assert "ERROR" in done.stdout and "Traceback" not in done.stderr  # type: ignore[attr-defined]
    assert f"mha-verify: error: properties/{BUGGY.name}: not the target's" in done.stderr  # type: ignore[attr-defined]
