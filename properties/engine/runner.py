"""Run checks with Hypothesis and turn the outcome into CheckResults: a property against one
target (:func:`run_property`), or a relation between two targets on the same examples
(:func:`run_relation`), through one engine: the same example database keys, per-check seeds,
boundary sweep, shrink budget and verdict rules.

Every target is a :class:`~mha_verify.properties.protocol.Subject`; the instance a check calls
is wrapped in :class:`~mha_verify.properties.engine.call_path.Checked`, the one call path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, given, reject
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from mha_verify.mha.reference import multi_head
from mha_verify.properties.engine.call_path import Checked, raised_by_target, target_side, weights_if_any
from mha_verify.properties.engine.keyed_database import keyed
from mha_verify.properties.engine.lazy_modules import shield_module_walk
from mha_verify.properties.engine.measure import Measure, Violation, error_line
from mha_verify.properties.engine.precision import read_precision
from mha_verify.properties.engine.registry import Property, Relation, StrategyFn
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.protocol import (
    LAWS_ONLY,
    NO_MASK,
    SELF_ONLY,
    Conventions,
    NotApplicable,
    Subject,
    TargetError,
)
from mha_verify.properties.strategies.examples import AttnExample
from mha_verify.properties.strategies.size_cases import boundary_cases, forced_size_case, modest_size_cases

#: called after every example a check ran: the example, and what it measured or the exception it
#: raised (a Violation, NotApplicable, or the target's own error)
Observer = Callable[[AttnExample, "Measure | BaseException"], None]


class TargetExited(Exception):  # noqa: N818 -- the target's own act, reported as its failure
    """The target raised SystemExit while a check called it."""


@dataclass
class _Stats:
    checked: int = 0  # examples that compared something
    unchecked: int = 0  # examples that compared nothing (not counted as passes)
    unchecked_why: dict[str, int] = field(default_factory=dict)
    worst: Measure = field(default_factory=Measure)
    declared: bool = False
    remarks: list[str] = field(default_factory=list)
    findings: dict[str, str] = field(default_factory=dict)  # kind -> the first example's evidence
    failure: str | None = None
    ours: bool = False  # the failure recorded last was raised by mha-verify's own check, not the target
    failing_example: AttnExample | None = None
    failing_ratio: float | str | None = None
    ratios: list[float | str] = field(default_factory=list)  # error / allowed, per checked example
    first_failure_at: float | None = None  # perf_counter() of the first failing example
    shrink_steps: int = 0  # examples run after the first failure
    safety_net: bool = False  # shrinking was stopped by SHRINK_SAFETY_SECONDS, not SHRINK_STEPS


#: examples Hypothesis may run while shrinking, after the first failure; then the smallest
#: failing example found so far is the counterexample. Counted in examples, not seconds, so that
#: a CI gate prints the same counterexample on a fast machine and a slow one (a wall-clock budget
#: shrank one layer to Lq = 64 in one run and to Lq = 129 when its forward was slower). Shrinking
#: a failure found at 257 positions or d_model 1024 without a limit took minutes, and a check
#: killed at its timeout reports a "hang" instead of what failed.
SHRINK_STEPS = 200
#: a safety net in seconds: shrinking that still runs this long after the first failure stops
#: there, and the verdict says so (its counterexample then depends on the machine's speed)
SHRINK_SAFETY_SECONDS = 45.0


def _same_example(a: AttnExample, b: AttnExample | None) -> bool:
    """``a`` and ``b`` are the very same input: sizes, values, mask, scales and seed."""
    if b is None or (a.sizes, a.scales, a.seed, a.mask_spec) != (b.sizes, b.scales, b.seed, b.mask_spec):
        return False
    if a.mask is None or b.mask is None:
        if a.mask is not b.mask:
            return False
    elif not torch.equal(a.mask, b.mask):
        return False
    return all(torch.equal(x, y) for x, y in ((a.q, b.q), (a.k, b.k), (a.v, b.v)))


def _ratio(m: Measure) -> float:
    if m.allowed > 0:
        return m.error / m.allowed
    return 0.0 if m.error == 0 else float("inf")


def _json_ratio(x: float) -> float | str:
    """A ratio for the report: 4 significant digits, or "inf"/"nan" (JSON has neither)."""
    return float(f"{x:.4g}") if math.isfinite(x) else str(x)


def _summary(exc: BaseException, ours: bool = False) -> str:
    if isinstance(exc, Violation):
        return str(exc)
    if ours:
        return (f"not the target's: mha-verify's check raised {type(exc).__name__}: {error_line(exc)} "
                "(a defect of mha-verify; nothing was checked after it)")
    return f"the target raised {type(exc).__name__}: {error_line(exc)}"


SWEEP_EXAMPLES = 2  # examples per boundary case of the sizes, swept after the random examples


def check_floor(settings: Settings) -> int:
    """Fewest checked examples for a verdict of pass: a fifth of the profile's examples (at least 1).

    A property that compared something on fewer examples than this is a warning: its pass
    would rest on too little.
    """
    return max(1, math.ceil(settings.max_examples / 5))


def effective_dtype(prop: Property, conv: Conventions, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a property runs in: the target's fixed dtype, else the property's own float64
    (gradcheck), else ``dtype`` (``check --dtype``), else float32."""
    if conv.dtype is not None:
        return conv.dtype
    if prop.dtype == torch.float64 or dtype is None:
        return prop.dtype
    return dtype


def phase_seed(name: str, phase: str, seed: int | None) -> int:
    """The Hypothesis seed of one phase of property ``name``: fixed, and salted with the user's
    ``seed`` if any.

    Derandomized, Hypothesis seeds from the test function's source, which is the same for every
    property and phase: properties with the same strategy drew the same examples, and one user
    seed for all did the same. A seed per (property, phase) is as deterministic, and every
    property draws its own examples.
    """
    return zlib.crc32(f"{name}|{phase}".encode() if seed is None else f"{name}|{phase}|{seed}".encode())


def _check_example(evaluate: Callable[[AttnExample], Measure], stats: _Stats, ex: AttnExample,
                   observer: Observer | None = None) -> None:
    """One example: ``evaluate`` it (build the target(s) at its sizes, run the check) and record
    the measure in ``stats``."""
    if stats.first_failure_at is not None and not _same_example(ex, stats.failing_example):
        stats.shrink_steps += 1
        over_time = time.perf_counter() - stats.first_failure_at > SHRINK_SAFETY_SECONDS
        if stats.shrink_steps > SHRINK_STEPS or over_time:
            # Spent: every other example Hypothesis tries is rejected, so shrinking ends. The last
            # failure recorded is Hypothesis's smallest; it still runs, so Hypothesis's final replay
            # of it fails as before (no flaky error) and the database stores that very example.
            stats.safety_net |= over_time and stats.shrink_steps <= SHRINK_STEPS
            reject()
    try:
        try:
            measure = evaluate(ex)
        except SystemExit as exc:  # the target's sys.exit(): this check's failure, never the gate's exit code
            raise TargetExited(f"the target called sys.exit({exc.code!r})") from None
    except NotApplicable as exc:  # the target could not take this one call: nothing compared
        why = str(exc)
        stats.unchecked += 1
        stats.unchecked_why[why] = stats.unchecked_why.get(why, 0) + 1
        if observer is not None:
            observer(ex, exc)
        return
    except Exception as exc:
        stats.ours = not (raised_by_target(exc) or isinstance(exc, TargetExited))
        stats.failure, stats.failing_example = _summary(exc, stats.ours), ex
        if stats.first_failure_at is None:
            stats.first_failure_at = time.perf_counter()
        if isinstance(exc, Violation):
            failing = Measure(exc.error, exc.allowed)
            stats.worst = max(stats.worst, failing, key=_ratio)
            stats.failing_ratio = _json_ratio(_ratio(failing))
        else:
            stats.failing_ratio = "nan"
        if observer is not None:
            observer(ex, exc)
        raise
    if observer is not None:
        observer(ex, measure)
    if not measure.checked:
        stats.unchecked += 1
        return
    stats.checked += 1
    stats.ratios.append(_json_ratio(_ratio(measure)))
    stats.declared |= measure.declared
    if measure.finding is not None:
        stats.findings.setdefault(*measure.finding)
    if measure.remark and len(stats.remarks) < 3 and measure.remark.split(":")[0] not in {
            r.split(":")[0] for r in stats.remarks}:
        stats.remarks.append(measure.remark)  # one of each kind: the first example's words
    if _ratio(measure) >= _ratio(stats.worst):
        stats.worst = measure


def run_property(
    prop: Property, target: Subject, *, settings: Settings, seed: int | None = None,
    replay: str | None = None, dtype: torch.dtype | None = None, observer: Observer | None = None,
    on_failure: Callable[[CheckResult, AttnExample, torch.dtype], str] | None = None,
) -> CheckResult:
    """Run one property against ``target`` under ``settings``; never raises for target failures.

    Whether the property applies is decided before the run, from the target's conventions.
    Only examples that compared something count; a property that checked fewer than
    :func:`check_floor` examples is a warning with the reason. ``observer`` sees every example;
    ``on_failure`` gets a failure's counterexample and dtype (a reproduction bundle's writer), and
    what it says is kept in ``details["bundle"]``.
    """
    start = time.perf_counter()
    conv = target.build(*target.probe_sizes, dtype=prop.dtype if dtype is None else dtype).conventions
    run_dtype = effective_dtype(prop, conv, dtype)
    reason = prop.not_applicable(conv)
    # a property n/a is not probed: the float64 probe of a layer that takes no gradients here (FlexAttention
    # on the CPU) leaves torch's compiler refusing the layer for the rest of the process
    if reason is None and run_dtype == torch.float64 and prop.dtype == torch.float64 and conv.dtype is None:
        policy = precision_policy(prop, target, conv)
        if policy is not None:
            policy.seconds = time.perf_counter() - start
            return policy

    def evaluate(ex: AttnExample) -> Measure:
        s = ex.sizes
        with target_side():
            built = Checked(target.build(s.d_model, s.n_head, seed=ex.seed, dtype=run_dtype))
        return prop.check(built, ex)

    result, ex = _search(prop.name, prop.strategy, prop.reach, conv, run_dtype, evaluate, key=target.spec,
                         reason=reason, settings=settings, seed=seed, observer=observer,
                         replay=replay, start=start)
    if result.verdict == "fail" and prop.needs_oracle and conv.departures:
        # the oracle applied what the layer's library declares; the code said otherwise
        result.reason = f"{result.reason} (its code departs from its spec: {'; '.join(conv.departures)})"
    if ex is not None:
        result.details["heatmap"] = heatmap(target, ex, run_dtype)
        if on_failure is not None:
            result.details["bundle"] = on_failure(result, ex, run_dtype)
    return result


def precision_policy(prop: Property, target: Subject, conv: Conventions) -> CheckResult | None:
    """n/a for a float64 property, with the finding, where ``target`` computes float64 inputs at a
    lower precision that explains its error (:mod:`~mha_verify.properties.engine.precision`); None
    where it computes in float64, or where the reading could not be taken (the property then runs,
    and says what the target raised)."""
    try:
        reading = read_precision(target)
    except (Exception, SystemExit):  # the property's own run reports what the target does
        return None
    if not reading.policy:
        return None
    held = ("its gradients are held by grad_agreement in the dtypes it works in" if conv.grads
            else "it takes no gradients")
    return CheckResult(prop.name, "properties", "n/a", kind="precision_policy",
                       reason=f"{reading.finding()}. A float64 {prop.name} would measure that rounding, not the layer; "
                              f"{held}",
                       worst_error=reading.error, allowed=reading.allowed64,
                       details={"conventions": conv.describe(), "precision": {
                           "dtype": reading.dtype, "error": reading.error, "allowed_float64": reading.allowed64,
                           "allowed_low": reading.allowed_low, "steps": [s.describe() for s in reading.steps]}})


def run_relation(
    rel: Relation, first: Subject, second: Subject, *, settings: Settings, seed: int | None = None,
    observer: Observer | None = None,
) -> CheckResult:
    """Run one relation between ``first`` and ``second`` on the examples drawn for ``first``'s
    conventions, each built at the example's sizes and seed; the same engine as :func:`run_property`."""
    start = time.perf_counter()
    conv = first.build(*first.probe_sizes).conventions
    run_dtype = conv.dtype if conv.dtype is not None else torch.float32

    def evaluate(ex: AttnExample) -> Measure:
        s = ex.sizes
        with target_side():
            a = Checked(first.build(s.d_model, s.n_head, seed=ex.seed, dtype=run_dtype))
            b = Checked(second.build(s.d_model, s.n_head, seed=ex.seed, dtype=run_dtype))
        return rel.check(a, b, ex)

    result, _ = _search(rel.name, rel.strategy, rel.reach, conv, run_dtype, evaluate,
                        key=f"{first.spec}|{second.spec}", reason=None, settings=settings, seed=seed,
                        observer=observer, replay=None, start=start)
    return result


def _search(
    name: str, strategy_fn: StrategyFn, reach: str, conv: Conventions, run_dtype: torch.dtype,
    evaluate: Callable[[AttnExample], Measure], *, key: str, reason: str | None, settings: Settings,
    seed: int | None, observer: Observer | None, replay: str | None, start: float,
) -> tuple[CheckResult, AttnExample | None]:
    """The engine: draw examples for ``conv``, ``evaluate`` each, and give the verdict (and the
    failing example, if any)."""
    conventions = conv.describe()
    run_conv = dataclasses.replace(conv, dtype=run_dtype)
    with contextlib.nullcontext() if reach == "full" else modest_size_cases():
        strategy = reason or strategy_fn(run_conv)
    if isinstance(strategy, str):
        # an argument the layer takes and its own source does not use: a mask, or keys and values
        said = conv.mask_ignored if strategy == NO_MASK else \
            conv.context_ignored if strategy.startswith(SELF_ONLY) else None
        why = f"{strategy}: {said}" if said is not None else strategy
        if said is None and strategy == NO_MASK and conv.mask_unsupported:
            why = f"{strategy} the harness draws: {conv.mask_unsupported}"
        kind = "ignored" if said is not None else "beyond" if strategy.startswith(LAWS_ONLY) else None
        return CheckResult(name, "properties", "n/a", reason=why, kind=kind,
                           seconds=time.perf_counter() - start,
                           details={"conventions": conventions}), None
    stats = _Stats()
    shield_module_walk()

    def body(ex: AttnExample) -> None:  # kept short: Hypothesis reads (and tokenizes) its source every run
        _check_example(evaluate, stats, ex, observer)
        shield_module_walk()  # modules the target's call imported, before the next draw walks them

    def run(strategy: st.SearchStrategy[AttnExample], settings: Settings, phase: str) -> BaseException | None:
        test = given(strategy)(body)
        if seed is not None or settings.derandomize:
            test = hypothesis_seed(phase_seed(name, phase, seed))(test)
        # The settings go on after the seed: @seed sets database=None on the settings it finds,
        # and a seeded run with a database (`--database` with the ci profile) would store nothing.
        test = Settings(settings, suppress_health_check=[*settings.suppress_health_check,
                                                        HealthCheck.filter_too_much, HealthCheck.too_slow])(test)
        try:
            test()
        except TargetError:
            raise
        except BaseException as exc:  # the target's own failure, shrunk by Hypothesis
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return exc
        return None

    # distinct example-database keys per check and target, so a failure replays first next time;
    # each boundary case has its own: its examples are drawn by another strategy, and a failure it
    # stored, replayed through the random phase's strategy, would be another example
    unkeyed = settings
    settings = keyed(settings, f"{name}|{key}")
    # The random examples first, then every boundary case of the sizes (two examples each): a
    # short derandomized run would otherwise reach only some of them. Random first, so that a
    # bug found at any size shrinks freely to the smallest example.
    cases = boundary_cases()
    if run_conv.sizes is not None or reach == "lengths":  # no heads case to sweep (fixed model, or too costly)
        cases = tuple(c for c in cases if c[0] != "heads")
    sweep = reach in ("full", "lengths") and settings.max_examples >= 3 * SWEEP_EXAMPLES * len(cases) / 2
    cases = cases if sweep else ()
    rest = max(1, settings.max_examples - SWEEP_EXAMPLES * len(cases))
    error = run(strategy, Settings(settings, max_examples=rest), "random")
    for case in cases if error is None or isinstance(error, Unsatisfiable) else ():
        with forced_size_case(case):
            swept = strategy_fn(run_conv)
        assert not isinstance(swept, str)
        phase = f"{case[0]}={case[1]}"
        found = run(swept, Settings(keyed(unkeyed, f"{name}|{key}|{phase}"), max_examples=SWEEP_EXAMPLES), phase)
        if found is not None and not isinstance(found, Unsatisfiable):
            error = found
            break
    if isinstance(error, Unsatisfiable) and stats.checked:
        error = None  # the random phase found nothing it could take, the sweep did
    seconds = time.perf_counter() - start
    worst = stats.worst
    ratios = stats.ratios + ([stats.failing_ratio] if stats.failing_ratio is not None else [])
    details: dict[str, object] = {"error_ratios": ratios, "checked": stats.checked, "unchecked": stats.unchecked,
                                  "conventions": conventions}
    if run_dtype != torch.float32:
        details["dtype"] = str(run_dtype).replace("torch.", "")

    def verdict(verdict: str, reason: str | None = None, **extra: object) -> CheckResult:
        return CheckResult(name, "properties", verdict, examples=stats.checked, seconds=seconds,
                           worst_error=worst.error, allowed=worst.allowed, details=details, reason=reason,
                           **extra)  # type: ignore[arg-type]

    if error is not None:
        if isinstance(error, Unsatisfiable) and stats.failure is None:
            return CheckResult(name, "properties", "warn", seconds=seconds, details=details,
                               reason="no generated example satisfied the target's conventions: nothing checked"), None
        if stats.failure is None:  # raised outside every call of the target: drawing, Hypothesis's own checks
            cause = error
            # an exception group (Hypothesis's FlakyFailure) says what it wraps: the first of it
            while isinstance(inner := getattr(cause, "exceptions", None), (list, tuple)) and inner \
                    and isinstance(inner[0], BaseException):
                cause = inner[0]
            first = (str(cause).strip().splitlines() or [""])[0][:300]
            return CheckResult(name, "properties", "error", seconds=seconds, details=details, reason=(
                f"not the target's: mha-verify's example generation raised {type(cause).__name__}: {first} "
                "(nothing was checked after it)")), None
        ex = stats.failing_example
        notes = [n for n in getattr(error, "__notes__", []) if "reproduce_failure" in n or "@seed" in n]
        if notes:
            details["hypothesis"] = notes
        reason = stats.failure or _summary(error)
        if stats.ours:  # mha-verify's own check raised: no verdict on the target, and no replay of it
            return verdict("error", reason, counterexample=None if ex is None else ex.describe()), None
        if stats.safety_net:
            reason += (f" (shrinking stopped by its {SHRINK_SAFETY_SECONDS:g} s safety net before its {SHRINK_STEPS} "
                       "steps: this counterexample depends on the machine's speed)")
        return verdict("fail", reason, replay=replay, counterexample=None if ex is None else ex.describe()), ex
    floor = check_floor(settings)
    if stats.checked < floor:
        drawn = stats.checked + stats.unchecked
        why = "; ".join(f"{w} ({n}x)" for w, n in stats.unchecked_why.items())
        return verdict("warn", f"checked something on only {stats.checked} of {drawn} examples "
                               f"(floor {floor}){': ' + why if why else ''}"), None
    if stats.findings:  # true, and not a defect under the layer's contract: said with its kind, never a pass
        kind, evidence = next(iter(stats.findings.items()))
        remarks = f" (also: {'; '.join(stats.remarks)})" if stats.remarks else ""
        return verdict("finding", evidence + remarks, kind=kind), None
    if stats.remarks:
        reason = "; ".join(stats.remarks)
        if stats.declared:
            reason += f" ({conv.fully_masked} as the target declares)"
        return verdict("warn", reason), None
    if stats.declared:
        return verdict("declared", f"the target declares fully masked rows give {conv.fully_masked} and behaves as "
                                   "declared"), None
    return verdict("pass"), None


def heatmap(target: Subject, ex: AttnExample, dtype: torch.dtype) -> dict[str, object]:
    """Attention weights of item 0 of a counterexample, (H, Lq, Lk), for the HTML report.

    The target's own weights where it returns them, else the float64 formula's with the
    target's projection weights (``source`` says which).
    """
    instance = target.build(ex.sizes.d_model, ex.sizes.n_head, seed=ex.seed, dtype=dtype)
    source = "target"
    try:
        got = weights_if_any(instance, ex.q, ex.k, ex.v, ex.mask)
    except (Exception, SystemExit):  # the target fails on this very example: show what it should have computed
        got = None
    if got is None and instance.conventions.beyond:  # the formula's weights would not be the layer's
        return {"source": f"none: the oracle does not model it ({instance.conventions.beyond})", "weights": []}
    if got is None:
        conv = instance.conventions
        got = multi_head(ex.q, ex.k, ex.v, instance.params(), instance.n_head, ex.mask, causal=conv.causal,
                         fully_masked=conv.fully_masked, scoring=conv.scoring)
        source = "float64 oracle with the target's weights"
    weights = got[1].detach().double()[0][:, :32, :32]  # (H, Lq, Lk), at most 32 x 32 per head
    return {"source": source, "weights": [[[float(f"{x:.4g}") for x in row] for row in head] for head in weights]}
