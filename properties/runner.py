"""Run properties against a target with Hypothesis and turn the outcome into CheckResults."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis.errors import Unsatisfiable

from properties.adapters import NotApplicable
from properties.checks import Measure, Violation
from properties.registry import Property, all_properties
from properties.results import CheckResult
from properties.strategies import AttnExample
from properties.targets import Target, TargetError


@dataclass
class _Stats:
    examples: int = 0
    worst: Measure = field(default_factory=Measure)
    declared: bool = False
    remarks: list[str] = field(default_factory=list)
    not_applicable: str | None = None
    failure: str | None = None
    failing_example: AttnExample | None = None
    ratios: list[float] = field(default_factory=list)  # error / allowed, per passing example


def _ratio(m: Measure) -> float:
    if m.allowed > 0:
        return m.error / m.allowed
    return 0.0 if m.error == 0 else float("inf")


def _summary(exc: BaseException) -> str:
    if isinstance(exc, Violation):
        return str(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"the target raised {type(exc).__name__}: {first[:300]}"


def run_property(
    prop: Property, target: Target, *, settings: Settings, seed: int | None = None,
    replay: str | None = None,
) -> CheckResult:
    """Run one property against ``target`` under ``settings``; never raises for target failures."""
    start = time.perf_counter()
    probe = target.build(8, 2, dtype=prop.dtype)
    strategy = prop.strategy(probe.conventions)
    if isinstance(strategy, str):
        return CheckResult(prop.name, "properties", "n/a", reason=strategy, seconds=time.perf_counter() - start)
    stats = _Stats()

    def body(ex: AttnExample) -> None:
        if stats.not_applicable:
            return
        s = ex.sizes
        bound = target.build(s.d_model, s.n_head, seed=ex.seed, dtype=prop.dtype)
        try:
            measure = prop.check(bound, ex)
        except NotApplicable as exc:
            stats.not_applicable = str(exc)
            return
        except Exception as exc:
            stats.failure, stats.failing_example = _summary(exc), ex
            if isinstance(exc, Violation):
                stats.worst = max(stats.worst, Measure(exc.error, exc.allowed), key=_ratio)
            raise
        stats.examples += 1
        stats.ratios.append(float(f"{_ratio(measure):.4g}"))
        stats.declared |= measure.declared
        if measure.remark and len(stats.remarks) < 3 and measure.remark.split(":")[0] not in {
                r.split(":")[0] for r in stats.remarks}:
            stats.remarks.append(measure.remark)  # one of each kind: the first example's words
        if _ratio(measure) >= _ratio(stats.worst):
            stats.worst = measure

    test = given(strategy)(body)
    # distinct example-database keys per property and target, so a failure replays first next time
    test._hypothesis_internal_add_digest = f"{prop.name}|{target.spec}".encode()  # type: ignore[attr-defined]
    test = Settings(settings, suppress_health_check=[*settings.suppress_health_check, HealthCheck.filter_too_much,
                                                    HealthCheck.too_slow])(test)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    error: BaseException | None = None
    try:
        test()
    except Unsatisfiable as exc:
        error = exc
    except TargetError:
        raise
    except BaseException as exc:  # the target's own failure, shrunk by Hypothesis
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        error = exc
    seconds = time.perf_counter() - start
    worst = stats.worst
    common = dict(examples=stats.examples, seconds=seconds, worst_error=worst.error, allowed=worst.allowed,
                  details={"error_ratios": stats.ratios})
    if stats.not_applicable and stats.failure is None:
        return CheckResult(prop.name, "properties", "n/a", reason=stats.not_applicable, seconds=seconds)
    if error is not None:
        if isinstance(error, Unsatisfiable) and stats.failure is None:
            return CheckResult(prop.name, "properties", "n/a", reason="no example satisfied the target's conventions",
                               seconds=seconds)
        ex = stats.failing_example
        notes = [n for n in getattr(error, "__notes__", []) if "reproduce_failure" in n or "@seed" in n]
        details = common["details"]
        assert isinstance(details, dict)
        if notes:
            details["hypothesis"] = notes
        if ex is not None:
            details["heatmap"] = heatmap(target, prop, ex)
        return CheckResult(
            prop.name, "properties", "fail", **common,  # type: ignore[arg-type]
            counterexample=None if ex is None else ex.describe(),
            reason=stats.failure or _summary(error), replay=replay,
        )
    if stats.remarks:
        reason = "; ".join(stats.remarks)
        if stats.declared:
            reason += " (NaN as the target declares)"
        return CheckResult(prop.name, "properties", "warn", reason=reason, **common)  # type: ignore[arg-type]
    if stats.declared:
        declared = probe.conventions.fully_masked
        return CheckResult(prop.name, "properties", "declared", **common,  # type: ignore[arg-type]
                           reason=f"the target declares fully masked rows give {declared} and behaves as declared")
    return CheckResult(prop.name, "properties", "pass", **common)  # type: ignore[arg-type]


def heatmap(target: Target, prop: Property, ex: AttnExample) -> dict[str, object]:
    """Attention weights of item 0 of a counterexample, (H, Lq, Lk), for the HTML report.

    The target's own weights where it returns them, else the float64 formula's with the
    target's projection weights (``source`` says which).
    """
    bound = target.build(ex.sizes.d_model, ex.sizes.n_head, seed=ex.seed, dtype=prop.dtype)
    source = "target"
    try:
        got = bound.with_weights_if_any(ex.q, ex.k, ex.v, ex.mask)
    except Exception:  # the target fails on this very example: show what it should have computed
        got = None
    if got is None:
        from mha.reference import multi_head

        got = multi_head(ex.q, ex.k, ex.v, bound.params(), bound.n_head, ex.mask)
        source = "float64 oracle with the target's weights"
    weights = got[1].detach().double()[0]
    return {"source": source, "weights": [[[float(f"{x:.4g}") for x in row] for row in head] for head in weights]}


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
