"""The one check that only exists across the export boundary: onnxruntime against the eager
module on identical inputs.

Every other check of an ONNX model is a property of the registry run against an
:class:`mha_verify.export.ort_target.OrtTarget`. This one needs both sides: a model whose initializers
are stale, or a graph that computes a different function than the eager module, can agree
with the float64 formula evaluated with *its own* weights yet not with the module the user
deploys from.

Tolerance. On each example the float64 oracle (the formula with the eager module's
weights) is computed once; each side is allowed the derived tolerance of the rule in
:mod:`mha_verify.mha.tolerance` (``A = 4 x |same-precision formula - oracle| + floor``), so the two may
differ by ``A_ort + A_eager``. The sum of the two sides' *measured* errors against the
oracle is not used as the allowance: by the triangle inequality ``|ort - eager|`` never
exceeds it, so such a check could not fail. Both measured errors are reported, and a
failure says which side is off the oracle (a wrong eager module no longer widens onnxruntime's
allowance, as the former "eager" check did).
"""

from __future__ import annotations

import math
import time

import torch
from hypothesis import HealthCheck, given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as Settings

from mha_verify.mha.tolerance import tolerance_for
from mha_verify.properties.adapters import NotApplicable
from mha_verify.properties.applicable import comparable_rows
from mha_verify.properties.measure import Violation, oracle
from mha_verify.properties.registry import all_properties
from mha_verify.properties.results import CheckResult
from mha_verify.properties.strategies import AttnExample
from mha_verify.properties.targets import Bound

NAME = "ort_vs_eager"


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.detach().double() - b.detach().double()).abs()
    if d.numel() == 0:
        return 0.0
    return float(d.max()) if bool(torch.isfinite(d).all()) else math.inf


def differential_check(ort_bound: Bound, eager: Bound, *, settings: Settings, seed: int | None = None,
                       stage: str = "export") -> CheckResult:
    """|onnxruntime - eager| <= A_ort + A_eager on the examples ``oracle_agreement`` draws for the model."""
    start = time.perf_counter()
    conv = ort_bound.conventions
    strategy = all_properties()["oracle_agreement"].strategy(conv)
    if isinstance(strategy, str):
        return CheckResult(NAME, stage, "n/a", reason=strategy)
    nan_rows = conv.fully_masked != "zeros" or eager.conventions.fully_masked != "zeros"
    state: dict[str, object] = {"n": 0, "worst": (0.0, 0.0), "fail": None}

    def body(ex: AttnExample) -> None:
        try:
            with torch.no_grad():
                got = ort_bound(ex.q, ex.k, ex.v, ex.mask)
                want = eager(ex.q, ex.k, ex.v, ex.mask)
        except NotApplicable:
            return
        ref, _, same = oracle(eager, ex)  # float64 and same-precision formula with the eager weights
        rows = comparable_rows(ex) if nan_rows else None
        if rows is not None:
            got, want, ref, same = got[rows], want[rows], ref[rows], same[rows]
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        one = tolerance_for(ex.q.dtype).allowed(_max_abs(same, ref), scale)
        allowed = 2 * one
        diff = _max_abs(got, want)
        state["n"] = int(state["n"]) + 1  # type: ignore[call-overload]
        worst = state["worst"]
        assert isinstance(worst, tuple)
        if allowed == 0 or diff / allowed >= (worst[0] / worst[1] if worst[1] else 0.0):
            state["worst"] = (diff, allowed)
        if not diff <= allowed:
            e_ort, e_eager = _max_abs(got, ref), _max_abs(want, ref)
            off = [side for side, e in (("onnxruntime", e_ort), ("eager", e_eager)) if not e <= one]
            state["fail"] = (ex.describe(), (
                f"max |onnxruntime - eager| {diff:.3g} > allowed {allowed:.3g} (each side may stray {one:.3g} from "
                f"the float64 oracle with the eager weights; onnxruntime strays {e_ort:.3g}, eager {e_eager:.3g}: "
                f"{' and '.join(off) or 'neither alone'} off the oracle)"))
            raise Violation(str(state["fail"]), diff, allowed)

    test = given(strategy)(body)
    test._hypothesis_internal_add_digest = f"{NAME}|{ort_bound.n_head}".encode()  # type: ignore[attr-defined]
    test = Settings(settings, suppress_health_check=[*settings.suppress_health_check, HealthCheck.filter_too_much,
                                                    HealthCheck.too_slow])(test)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    crash = None
    try:
        test()
    except Violation:
        pass
    except Exception as exc:  # onnxruntime refusing a shape, a bug in the eager module
        crash = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
    seconds = time.perf_counter() - start
    n = int(state["n"])  # type: ignore[call-overload]
    worst = state["worst"]
    assert isinstance(worst, tuple)
    fail = state["fail"]
    if isinstance(fail, tuple):
        return CheckResult(NAME, stage, "fail", n, worst[0], worst[1], seconds, counterexample=fail[0],
                           reason=fail[1])
    if crash is not None:
        return CheckResult(NAME, stage, "fail", n, seconds=seconds, reason=crash)
    if n == 0:
        return CheckResult(NAME, stage, "n/a", seconds=seconds, reason="no example both sides can take")
    return CheckResult(NAME, stage, "pass", n, worst[0], worst[1], seconds)
