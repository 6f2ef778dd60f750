"""Run one whole-model check over generated batches with Hypothesis, into a :class:`CheckResult`.

A check that raises :class:`Violation` fails on the batch Hypothesis shrinks to (named in the
result with what to replay); one that checked no batch is n/a, never a pass; a finding is said
with its kind. An exception raised by onnxruntime or the eager model is a failure of the check,
named with its type: a model that cannot take a batch it declares it takes is a defect. An
exception of the check's own code is an error of the run: no verdict, and never a green run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given
from hypothesis import settings as Settings
from hypothesis.errors import Flaky

from mha_verify.properties.engine.measure import Measure, Violation
from mha_verify.properties.engine.results import KINDS, CheckResult
from mha_verify.properties.model import cache, checks
from mha_verify.properties.model.batches import PADDING, Batch, batches
from mha_verify.properties.model.checks import ModelRaised, ModelUnderTest, nearest
from mha_verify.properties.model.replay import ModelViolation, Replay

STAGE = "model"

#: name -> check, in the order they run
CHECKS = {**checks.CHECKS, "cache_consistency": cache.cache_consistency}
#: name -> why the check does not apply to a model ("" where it does); a check not named applies
_APPLIES = {"cache_consistency": cache.why_not, "fully_padded_finite": lambda mut: mut.needs_tokens}


@dataclass
class _Stats:
    examples: int = 0
    checked: int = 0
    worst: float = 0.0
    allowed: float | None = None
    findings: dict[str, str] = field(default_factory=dict)
    failing: Batch | None = None
    message: str = ""
    replay: Replay | None = None


#: writes a failure's replay as a bundle: (check name, replay, counterexample, reason) -> the command
#: that replays it
ReplayWriter = Callable[[str, Replay, str, str], str]


def run_check(name: str, mut: ModelUnderTest, settings: Settings, write_replay: ReplayWriter | None = None,
              ) -> CheckResult:
    """Check ``name`` of :data:`CHECKS` on ``mut`` over the batches ``settings`` allows; a failure with a
    replay is handed to ``write_replay`` (its command becomes the result's ``replay``)."""
    check = CHECKS[name]
    why_not = _APPLIES[name](mut) if name in _APPLIES else ""
    if why_not:
        return CheckResult(name, STAGE, "n/a", reason=why_not)
    stats = _Stats()
    sides = tuple(side for side in PADDING if name != "padding_invariance" or not mut.claims(side))
    strategy = batches(mut.eager.vocab_size, mut.eager.max_length, mut.eager.type_vocab_size, padding=sides,
                       empty_items=not mut.needs_tokens)
    start = time.perf_counter()

    @Settings(settings, report_multiple_bugs=False,  # one failure, the one shrunk last, is the verdict
              suppress_health_check=[*settings.suppress_health_check, HealthCheck.filter_too_much,
                                     HealthCheck.data_too_large])
    @given(strategy)
    def search(batch: Batch) -> None:
        stats.examples += 1
        try:
            measure: Measure = check(mut, batch)
        except ModelRaised as exc:
            outside = mut.outside(batch)
            if outside:  # a batch the graph documents it does not take: said, not held against it
                stats.findings.setdefault("precondition", f"{outside}; on {batch.describe()}: {exc}")
                return
            stats.failing, stats.message, stats.replay = batch, str(exc), None
            raise Violation(str(exc)) from None
        except Violation as exc:  # a verdict on the model (an exception of the check's own code is the
            stats.failing, stats.message = batch, str(exc)  # harness's: it ends the search)
            stats.replay = exc.replay if isinstance(exc, ModelViolation) else None
            raise
        if measure.checked:  # the worst is the example nearest its allowance, shown with that allowance
            stats.checked += 1
            held = (stats.worst, math.inf if stats.allowed is None else stats.allowed)
            stats.worst, stats.allowed = nearest(held, measure.error, measure.allowed)
        if measure.finding is not None:
            stats.findings.setdefault(*measure.finding)

    try:
        search()
    except Violation:
        assert stats.failing is not None
        replay = None if stats.replay is None or write_replay is None else write_replay(
            f"model/{name}", stats.replay, stats.failing.describe(), stats.message)
        return CheckResult(name, STAGE, "fail", examples=stats.examples, reason=stats.message,
                           counterexample=stats.failing.describe(), seconds=time.perf_counter() - start,
                           replay=replay)
    except Flaky:  # a batch that failed once and passed when run again: the model is not deterministic
        return CheckResult(name, STAGE, "fail", examples=stats.examples, seconds=time.perf_counter() - start,
                           reason=f"a batch failed, then passed when run again (not deterministic): {stats.message}",
                           counterexample=None if stats.failing is None else stats.failing.describe())
    except Exception as exc:  # raised by the check's own code or by Hypothesis: no verdict, never a green run
        return CheckResult(name, STAGE, "error", examples=stats.examples, seconds=time.perf_counter() - start,
                           counterexample=None if stats.failing is None else stats.failing.describe(),
                           reason=f"not the model's: mha-verify's check raised {type(exc).__name__}: "
                                  f"{(str(exc).strip().splitlines() or [''])[0][:300]} (nothing was checked after it)")
    seconds = time.perf_counter() - start
    unclaimed = [f"{side}: {mut.claims(side)}" for side in PADDING if mut.claims(side)] \
        if name == "padding_invariance" else []
    if stats.findings:  # each kind said; the result's kind is the first seen
        kind = next(iter(stats.findings))
        evidence = stats.findings[kind] if len(stats.findings) == 1 else " | ".join(
            f"{KINDS[k]}: {text}" for k, text in stats.findings.items())
        return CheckResult(name, STAGE, "finding", examples=stats.checked, worst_error=stats.worst,
                           allowed=stats.allowed, seconds=seconds, reason=evidence, kind=kind)
    if stats.checked == 0:
        return CheckResult(name, STAGE, "n/a", examples=stats.examples, seconds=seconds,
                           reason="no generated batch held anything this check compares"
                           + (f" ({'; '.join(unclaimed)})" if unclaimed else ""))
    return CheckResult(name, STAGE, "pass", examples=stats.checked, worst_error=stats.worst, allowed=stats.allowed,
                       seconds=seconds, reason="; ".join(unclaimed) or None)
