"""Validate an ONNX model against a target: onnxruntime vs the float64 oracle and the eager
module, and the attention invariants checked on the ONNX model itself.

For each (provider, optimization level) one session is created and reused over all
examples. Each check is its own Hypothesis loop over :func:`export.examples.export_examples`,
run with the profile settings passed in; a failure is shrunk and its counterexample
(``AttnExample.describe()``) recorded, and with ``bundle_dir`` a reproduction bundle is
written (:mod:`export.bundle`). Every comparison uses :func:`mha.tolerance.compare`: the
onnxruntime output against the float64 oracle, calibrated by a same-precision evaluation.

Checks (names ``<config>/<provider>/<opt-level>/<check>``):

oracle           ORT output vs the oracle; calibration: ``mha.reference.multi_head`` in the model's dtype.
eager            ORT output vs the oracle; calibration: the eager module's own output, i.e. ORT may
                 stray from the oracle by at most (a multiple of) what eager PyTorch does.
mask-invariance  replacing k/v at keys no query of an item may attend leaves the output unchanged.
permutation      permuting queries permutes the output rows; permuting keys (k, v, mask) changes nothing.
batch            each item run alone (B=1) gives its row of the batched result.
fully-masked     a query row whose keys are all masked in every head gives ``w_o.bias`` (finite).

and ``<config>/interface``: the graph's inputs (q, k, v present and read, B/Lq/Lk dynamic and
independent), see :func:`export.ort_model.interface_problems`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from hypothesis import Phase, given
from hypothesis import settings as Settings

from export.bundle import write_bundle
from export.examples import export_examples, keep_mask
from export.ort_model import OPT_LEVELS, PROVIDERS, ModelInterface, OrtModel, interface_problems, read_interface
from mha.reference import multi_head
from mha.tolerance import Comparison, compare
from properties.adapters import NotApplicable
from properties.results import CheckResult
from properties.strategies import AttnExample
from properties.targets import Bound

STAGE = "export"
CHECKS = ("oracle", "eager", "mask-invariance", "permutation", "batch", "fully-masked")
_NP_TO_TORCH: dict[object, torch.dtype] = {
    np.float32: torch.float32, np.float16: torch.float16, np.float64: torch.float64}


@dataclass
class Trial:
    """One comparison on one example: the feed given to ORT, expected (float64) and actual."""

    feed: dict[str, np.ndarray]
    expected: np.ndarray
    actual: np.ndarray | None
    comparison: Comparison | None
    error: str | None = None  # onnxruntime raised

    @property
    def ok(self) -> bool:
        return self.error is None and self.comparison is not None and self.comparison.ok


class _Mismatch(Exception):  # noqa: N818 -- a signal to Hypothesis, not an error
    pass


@dataclass
class _Reference:
    oracle: torch.Tensor  # (B, Lq, D) float64
    same: torch.Tensor  # (B, Lq, D) in the model's dtype
    eager: torch.Tensor | None  # (B, Lq, D) or None when the target cannot take this call


@dataclass
class _Context:
    model: OrtModel
    bound: Bound
    dtype: torch.dtype
    provider: str = "cpu"
    opt: str = "opt-all"
    nan_rows: bool = False  # the target declares NaN (not zeros) for fully masked rows
    cache: dict[tuple[object, ...], _Reference] = field(default_factory=dict)

    def reference(self, ex: AttnExample) -> _Reference:
        key = (ex.sizes, ex.mask_spec, ex.scales, ex.seed)
        if key not in self.cache:
            if len(self.cache) > 4096:
                self.cache.clear()
            params = self.bound.params()
            oracle, _ = multi_head(ex.q, ex.k, ex.v, params, self.bound.n_head, ex.mask)
            same, _ = multi_head(ex.q, ex.k, ex.v, params, self.bound.n_head, ex.mask, dtype=self.dtype)
            try:
                with torch.no_grad():
                    eager: torch.Tensor | None = self.bound(ex.q, ex.k, ex.v, ex.mask).detach().cpu()
            except NotApplicable:
                eager = None
            self.cache[key] = _Reference(oracle, same, eager)
        return self.cache[key]

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: np.ndarray | None
            ) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None]:
        feed = self.model.feed(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), keep)
        try:
            return feed, self.model.run(self.provider, self.opt, feed), None
        except Exception as exc:  # onnxruntime refusing a shape is the finding, not a crash
            return feed, None, f"onnxruntime raised {type(exc).__name__}: {str(exc).strip()[:300]}"

    def trial(self, feed: dict[str, np.ndarray], actual: np.ndarray | None, err: str | None,
              expected: torch.Tensor, same: torch.Tensor, rows: np.ndarray | None = None) -> Trial:
        """Compare ``actual`` with ``expected`` (float64) calibrated by ``same``, on ``rows`` if given."""
        if err is not None or actual is None:
            return Trial(feed, expected.numpy(), None, None, err)
        got = torch.from_numpy(np.asarray(actual))
        if rows is not None:
            got, expected, same = got[rows], expected[rows], same[rows]
        return Trial(feed, expected.numpy(), np.asarray(actual), compare(got, expected, same, self.dtype))


def _full_keep(keep: np.ndarray | None, ex: AttnExample) -> np.ndarray:
    """(B, H, Lq, Lk) bool: the mask broadcast in full (all True without a mask)."""
    s = ex.sizes
    if keep is None:
        return np.ones((s.batch, s.n_head, s.lq, s.lk), dtype=np.bool_)
    return np.broadcast_to(keep, (s.batch, s.n_head, s.lq, s.lk))


def _alive_rows(ctx: _Context, keep: np.ndarray | None, ex: AttnExample) -> np.ndarray | None:
    """For targets that declare NaN on fully masked rows: bool (B, Lq) of rows to compare, else None."""
    if not ctx.nan_rows or keep is None:
        return None
    full = np.asarray(_full_keep(keep, ex))
    alive: np.ndarray = np.all(np.any(full, axis=-1), axis=1)
    return alive


# --- the checks: each returns a Trial, or None when the example does not apply ----------------

def _check_oracle(ctx: _Context, ex: AttnExample) -> Trial | None:
    ref = ctx.reference(ex)
    keep = keep_mask(ex.mask)
    feed, actual, err = ctx.run(ex.q, ex.k, ex.v, keep)
    return ctx.trial(feed, actual, err, ref.oracle, ref.same, _alive_rows(ctx, keep, ex))


def _check_eager(ctx: _Context, ex: AttnExample) -> Trial | None:
    ref = ctx.reference(ex)
    if ref.eager is None:
        return None
    keep = keep_mask(ex.mask)
    feed, actual, err = ctx.run(ex.q, ex.k, ex.v, keep)
    return ctx.trial(feed, actual, err, ref.oracle, ref.eager, _alive_rows(ctx, keep, ex))


def _check_mask_invariance(ctx: _Context, ex: AttnExample) -> Trial | None:
    keep = keep_mask(ex.mask)
    if keep is None:
        return None
    unused = ~_full_keep(keep, ex).any(axis=(1, 2))  # (B, Lk): keys no query of the item may attend
    if not unused.any():
        return None
    gen = torch.Generator().manual_seed(ex.seed + 7)
    scale = torch.tensor(ex.scales, dtype=torch.float64).view(-1, 1, 1)  # (B, 1, 1)
    fresh_k = (torch.randn(ex.k.shape, generator=gen, dtype=torch.float64) * scale * 2).to(ctx.dtype)
    fresh_v = (torch.randn(ex.v.shape, generator=gen, dtype=torch.float64) * scale * 2).to(ctx.dtype)
    where = torch.from_numpy(unused).unsqueeze(-1)  # (B, Lk, 1)
    k2, v2 = torch.where(where, fresh_k, ex.k), torch.where(where, fresh_v, ex.v)
    ref = ctx.reference(ex)
    feed, actual, err = ctx.run(ex.q, k2, v2, keep)
    return ctx.trial(feed, actual, err, ref.oracle, ref.same, _alive_rows(ctx, keep, ex))


def _check_permutation(ctx: _Context, ex: AttnExample) -> Trial | None:
    s = ex.sizes
    if s.lq == 1 and s.lk == 1:
        return None
    rng = np.random.default_rng(ex.seed)
    pq, pk = torch.from_numpy(rng.permutation(s.lq)), torch.from_numpy(rng.permutation(s.lk))
    keep = keep_mask(ex.mask)
    keep2 = None if keep is None else keep[:, :, pq.numpy()][:, :, :, pk.numpy()]
    ref = ctx.reference(ex)
    feed, actual, err = ctx.run(ex.q[:, pq], ex.k[:, pk], ex.v[:, pk], keep2)
    alive = _alive_rows(ctx, keep, ex)
    return ctx.trial(feed, actual, err, ref.oracle[:, pq], ref.same[:, pq], None if alive is None else alive[:, pq])


def _check_batch(ctx: _Context, ex: AttnExample) -> Trial | None:
    if ex.sizes.batch == 1:
        return None
    keep = keep_mask(ex.mask)
    ref = ctx.reference(ex)
    alive = _alive_rows(ctx, keep, ex)
    worst: Trial | None = None
    for b in range(ex.sizes.batch):
        item_keep = None if keep is None else keep[b:b + 1] if keep.shape[0] > 1 else keep
        feed, actual, err = ctx.run(ex.q[b:b + 1], ex.k[b:b + 1], ex.v[b:b + 1], item_keep)
        t = ctx.trial(feed, actual, err, ref.oracle[b:b + 1], ref.same[b:b + 1],
                      None if alive is None else alive[b:b + 1])
        if not t.ok:
            return t
        if worst is None or (t.comparison and worst.comparison and t.comparison.error > worst.comparison.error):
            worst = t
    return worst


def _check_fully_masked(ctx: _Context, ex: AttnExample) -> Trial | None:
    keep = keep_mask(ex.mask)
    if keep is None:
        return None
    full = np.asarray(_full_keep(keep, ex))
    dead: np.ndarray = ~np.any(full, axis=(1, 3))  # (B, Lq): rows with no key in any head
    if not dead.any():
        return None
    ref = ctx.reference(ex)
    feed, actual, err = ctx.run(ex.q, ex.k, ex.v, keep)
    return ctx.trial(feed, actual, err, ref.oracle, ref.same, dead)


_CHECK_FNS: dict[str, Callable[[_Context, AttnExample], Trial | None]] = {
    "oracle": _check_oracle, "eager": _check_eager, "mask-invariance": _check_mask_invariance,
    "permutation": _check_permutation, "batch": _check_batch, "fully-masked": _check_fully_masked,
}


def _ratio(comp: Comparison) -> float:
    """How much of the allowed error an example used (the worst example has the largest)."""
    return comp.error / comp.allowed if comp.allowed > 0 else float("inf") if comp.error > 0 else 0.0


def _run_check(check: str, ctx: _Context, name: str, settings: Settings, model_path: Path,
               bundle_dir: Path | None, kinds: tuple[str, ...] | None, shrink: bool = True) -> CheckResult:
    fn = _CHECK_FNS[check]
    state: dict[str, object] = {"n": 0, "worst": None, "fail": None}
    strategy = (export_examples(ctx.bound.d_model, ctx.bound.n_head, dtype=ctx.dtype, kinds=kinds) if kinds
                else export_examples(ctx.bound.d_model, ctx.bound.n_head, dtype=ctx.dtype))

    # database=None: the example database is keyed by this inner function, shared by every
    # model validated; replaying one model's counterexamples on another only blurs counts.
    # shrink=False once another check of the model failed: a broken model fails every check,
    # and shrinking each of them costs seconds; the first failure is shrunk.
    phases = settings.phases if shrink else tuple(p for p in settings.phases if p != Phase.shrink)

    @Settings(parent=settings, database=None, phases=phases)
    @given(strategy)
    def prop(ex: AttnExample) -> None:
        trial = fn(ctx, ex)
        if trial is None:
            return
        state["n"] = int(state["n"]) + 1  # type: ignore[call-overload]
        worst = state["worst"]
        if trial.comparison is not None and (
                not isinstance(worst, Trial) or worst.comparison is None
                or _ratio(trial.comparison) > _ratio(worst.comparison)):
            state["worst"] = trial
        if not trial.ok:
            state["fail"] = (ex, trial)
            raise _Mismatch(trial.error or str(trial.comparison))

    start = time.perf_counter()
    crash: str | None = None
    try:
        prop()
    except _Mismatch:
        pass
    except Exception as exc:  # Hypothesis errors (flaky, unsatisfiable) or a bug in the target
        crash = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    seconds = time.perf_counter() - start
    n = int(state["n"])  # type: ignore[call-overload]
    details = {"provider": ctx.provider, "opt": ctx.opt}  # examples / seconds gives the rate; no timing here
    fail = state["fail"]
    worst = state["worst"]
    if isinstance(fail, tuple):
        ex, trial = fail
        assert isinstance(ex, AttnExample) and isinstance(trial, Trial)
        replay = None
        if bundle_dir is not None:
            folder = write_bundle(
                bundle_dir, name=name, model_path=model_path, feed=trial.feed, expected=trial.expected,
                actual=trial.actual, allowed=trial.comparison.allowed if trial.comparison else 0.0,
                provider=PROVIDERS[ctx.provider], opt_level=ctx.opt, output=ctx.model.info.output,
                counterexample=ex.describe(), verdict=trial.error or str(trial.comparison),
            )
            replay = f"python {folder / 'replay.py'}"
        comp = trial.comparison
        reason = trial.error or str(comp)
        if not shrink:
            reason += " (counterexample not shrunk: an earlier check of this model failed)"
        return CheckResult(
            name, STAGE, "fail", n, comp.error if comp else float("inf"), comp.allowed if comp else None,
            seconds, counterexample=ex.describe(), replay=replay, reason=reason, details=details,
        )
    if crash is not None:
        return CheckResult(name, STAGE, "fail", n, seconds=seconds, reason=crash, details=details)
    if n == 0:
        return CheckResult(name, STAGE, "n/a", 0, seconds=seconds,
                           reason="no generated example applied to this check", details=details)
    comp = worst.comparison if isinstance(worst, Trial) else None
    return CheckResult(name, STAGE, "pass", n, comp.error if comp else None, comp.allowed if comp else None,
                       seconds, details=details)


def model_dtype(info: ModelInterface) -> torch.dtype:
    """The torch dtype of the model's q input."""
    return _NP_TO_TORCH.get(info.dtype, torch.float32)


def validate_model(
    path: str | Path,
    bound: Bound,
    *,
    settings: Settings | None = None,
    providers: Sequence[str] = ("cpu",),
    opt_levels: Sequence[str] = tuple(OPT_LEVELS),
    checks: Sequence[str] = CHECKS,
    bundle_dir: str | Path | None = None,
    name: str | None = None,
) -> list[CheckResult]:
    """Validate the ONNX model at ``path`` against ``bound`` (built in the model's dtype).

    Args:
        settings: Hypothesis settings (a profile from :mod:`properties.profiles`); default
            the loaded profile.
        providers: short names, see :data:`export.ort_model.PROVIDERS`; "cpu" always works.
        opt_levels: "opt-none" (ORT_DISABLE_ALL) and/or "opt-all" (ORT_ENABLE_ALL).
        bundle_dir: where to write a reproduction bundle for each failed check.
        name: the config prefix of result names; default from the model's metadata.
    Returns:
        ``[<config>/interface, <config>/<provider>/<opt>/<check> ...]``; ModelError
        (:mod:`export.ort_model`) if the file is missing or not ONNX.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # examples are tiny: threads only contend with onnxruntime's
    try:
        return _validate(Path(path), bound, settings, providers, opt_levels, checks, bundle_dir, name)
    finally:
        torch.set_num_threads(threads)


def _validate(path: Path, bound: Bound, settings: Settings | None, providers: Sequence[str],
              opt_levels: Sequence[str], checks: Sequence[str], bundle_dir: str | Path | None,
              name: str | None) -> list[CheckResult]:
    info = read_interface(path)
    config = name or info.config
    settings = settings or Settings()
    bad_checks = [c for c in checks if c not in CHECKS]
    bad_opts = [o for o in opt_levels if o not in OPT_LEVELS]
    bad_providers = [p for p in providers if p not in PROVIDERS]
    if bad_checks or bad_opts or bad_providers:
        raise ValueError(f"unknown checks {bad_checks}, opt levels {bad_opts} or providers {bad_providers}; "
                         f"known: {CHECKS}, {tuple(OPT_LEVELS)}, {tuple(PROVIDERS)}")
    problems = interface_problems(info)
    results = [CheckResult(f"{config}/interface", STAGE, "fail" if problems else "pass",
                           reason="; ".join(problems) or None,
                           details={"inputs": {n: i.dims for n, i in info.inputs.items()}})]
    if any("no input" in p for p in problems):
        return results
    dtype = model_dtype(info)
    model = OrtModel(path, info)
    nan_rows = bound.conventions.fully_masked != "zeros"
    kinds = None if "mask" in info.inputs else ("none",)
    bdir = Path(bundle_dir) if bundle_dir is not None else None
    for provider in providers:
        for opt in opt_levels:
            prefix = f"{config}/{provider}/{opt}"
            try:
                model.session(provider, opt)
            except Exception as exc:
                results.append(CheckResult(f"{prefix}/session", STAGE, "fail",
                                           reason=f"cannot create a session: {type(exc).__name__}: {exc}"))
                continue
            ctx = _Context(model, bound, dtype, provider, opt, nan_rows)
            for check in checks:
                if check == "fully-masked" and nan_rows:
                    results.append(CheckResult(f"{prefix}/{check}", STAGE, "n/a", reason=(
                        f"the target declares fully masked rows give {bound.conventions.fully_masked}")))
                    continue
                shrink = not any(r.failed for r in results[1:])
                results.append(_run_check(check, ctx, f"{prefix}/{check}", settings, path, bdir, kinds, shrink))
    return results
