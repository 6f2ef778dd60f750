"""Validate an ONNX model: the property registry against each (provider, optimization level)
target variant, the ``ort_vs_eager`` relation against the eager module, and the interface.

Result names are ``<label>/interface``, ``<label>/<provider>/<opt>/<property>`` and
``<label>/<provider>/<opt>/ort_vs_eager``, stage ``export``. Every property runs through
:mod:`mha_verify.properties.engine.runner`, the runner of eager targets; what a session cannot do is
n/a by its conventions (:class:`mha_verify.properties.onnx.ort_target.OrtInstance`).

Two ways to run: :func:`validate_model` in this process (the export stage and ``mha-verify
export`` run inside the gate's worker or validate a file they just wrote), and
:func:`validation_tasks`, the same checks as gate tasks (``mha_verify.gate.onnx_check``) for
:func:`mha_verify.isolation.run_tasks`, so an onnxruntime crash is that check's failure.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from hypothesis import settings as Settings

from mha_verify.mha.reference import multi_head
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.engine.runner import run_property, run_relation
from mha_verify.properties.invariants.suite import all_properties, all_relations
from mha_verify.properties.onnx.checks import frozen_axes, interface_problems
from mha_verify.properties.onnx.conventions import adopt_conventions, eager_conventions
from mha_verify.properties.onnx.interface import Interface, read_interface
from mha_verify.properties.onnx.ort_target import OPT_LEVELS, PROVIDERS, OrtTarget, params_from_graph
from mha_verify.properties.protocol import LAWS_ONLY
from mha_verify.properties.targets.eager import Bound, Fixed, load_target, load_weights
from mha_verify.repro_bundle import write_bundle
from mha_verify.tasks import Task

STAGE = "export"
DIFFERENTIAL = "ort_vs_eager"


def load_eager(info: Interface, *, target_spec: str | None, weights: str | os.PathLike[str] | None,
               weight_seed: int = 0, adapter: str | None = None) -> Bound:
    """The eager target at the model's sizes and dtype, with ``weights`` (a state_dict) if given.

    Raises TargetError (a usage error) when it cannot be built or the weights do not fit.
    """
    assert info.d_model is not None and info.n_head is not None
    bound = load_target(target_spec, adapter=adapter).build(info.d_model, info.n_head, seed=weight_seed,
                                                            dtype=info.dtype)
    if weights is not None:
        load_weights(bound, weights, info.dtype)
    return bound


def with_eager(info: Interface, eager: Bound) -> Interface:
    """The model's interface with the eager target's fully_masked and causal where nothing else states
    them (the eager layer is what the model was exported from)."""
    conv = eager.conventions
    adopted = adopt_conventions(info, eager_conventions(conv), "the eager target")
    return dataclasses.replace(adopted, layer_scoring=conv.scoring)


def interface_result(info: Interface, label: str, *, frozen: str = "fail", problems: Sequence[str] = (),
                     hints: Sequence[str] = ()) -> CheckResult:
    """``<label>/interface``: the static problems of the model's inputs (unread, merged) and ``problems``
    found by probing it (a declared mask kind the model contradicts), which fail; its frozen axes,
    which give ``frozen`` ("fail": our own exports must keep B, Lq and Lk dynamic; "warn": a model
    validated as it is, whose properties are judged at its fixed sizes); ``hints``, which warn."""
    problems = [*interface_problems(info), *problems]
    fixed = frozen_axes(info)
    verdict = "fail" if problems else frozen if fixed else "warn" if hints else "pass"
    if fixed:
        problems.append(", ".join(fixed) + ("; it must be dynamic" if frozen == "fail" else
                                            ": the properties were judged at that size only"))
    problems += hints
    return CheckResult(f"{label}/interface", STAGE, verdict, reason="; ".join(problems) or None,
                       details={"inputs": {r: list(s.dims) for r, s in info.roles.items()},
                                "mask_forms": sorted(info.mask_forms), "n_head_source": info.n_head_source})


def _bundle(result: CheckResult, target: OrtTarget, bundle_dir: str | os.PathLike[str]) -> CheckResult:
    """Write the last onnxruntime call of the shrunk counterexample as a bundle, held against the oracle."""
    instance = target.build(*target.probe_sizes)
    if instance.last is None:
        return result
    q, k, v, mask = instance.last
    try:
        feed = instance.feed(q, k, v, mask)
    except Exception:  # the failing call was one the model's interface refused: nothing to replay
        return result
    expected, _ = multi_head(q, k, v, instance.params(), instance.n_head, mask,
                              scoring=instance.conventions.scoring)
    try:
        actual: np.ndarray | None = instance.session.run([instance.info.output], feed)[0]
    except Exception:
        actual = None
    folder = write_bundle(
        Path(bundle_dir), name=result.name, model_path=target.info.path, feed=feed, expected=expected.numpy(),
        actual=actual, allowed=result.allowed or 0.0, provider=PROVIDERS[target.provider], opt_level=target.opt,
        output=target.info.output, counterexample=result.counterexample or "", verdict=result.reason or "",
    )
    return dataclasses.replace(result, replay=f"python {folder / 'replay.py'}")


def check_target(target: OrtTarget, check: str, *, settings: Settings, label: str, seed: int | None = None,
                 eager: Bound | None = None, bundle_dir: str | os.PathLike[str] | None = None) -> CheckResult:
    """One check (a property name, or ``ort_vs_eager``) of one target variant, named for the report."""
    prefix = f"{label}/{target.provider}/{target.opt}"
    if check == DIFFERENTIAL:
        if eager is None:
            result = CheckResult(DIFFERENTIAL, STAGE, "n/a", reason="no eager module: pass --target SPEC and --weights")
        else:
            result = run_relation(all_relations()[DIFFERENTIAL], target, Fixed(eager, "eager"), settings=settings,
                                  seed=seed)
    elif eager is not None and eager.conventions.beyond:
        # the session has no float64 forward to measure a law's allowance against, and the oracle does
        # not model the layer: the model is held to the eager layer, whose laws the properties checked
        result = CheckResult(check, STAGE, "n/a", kind="beyond", reason=(
            f"{LAWS_ONLY}: it takes {eager.conventions.beyond}, a step beyond the attention the oracle models: the "
            f"exported model is held to the eager layer by {DIFFERENTIAL}, and the laws were checked on the eager "
            "layer"))
    else:
        result = run_property(all_properties()[check], target, settings=settings, seed=seed)
    result = dataclasses.replace(result, name=f"{prefix}/{check}", stage=STAGE,
                                 details={**result.details, "provider": target.provider, "opt": target.opt})
    if result.failed and bundle_dir is not None and check != DIFFERENTIAL:
        result = _bundle(result, target, bundle_dir)
    return result


def checks_for(eager: bool) -> list[str]:
    """The property names, then the differential check where an eager module is given."""
    return [*all_properties(), *([DIFFERENTIAL] if eager else [])]


def validate_model(
    path: str | os.PathLike[str], *, settings: Settings, eager: Bound | None = None,
    providers: Sequence[str] = ("cpu",), opt_levels: Sequence[str] = tuple(OPT_LEVELS),
    checks: Sequence[str] | None = None, bundle_dir: str | os.PathLike[str] | None = None,
    name: str | None = None, seed: int | None = None, mapping: dict[str, str] | None = None,
    d_model: int | None = None, n_head: int | None = None, declared: dict[str, str] | None = None,
) -> list[CheckResult]:
    """Validate the model at ``path`` in this process: ``[interface, <provider>/<opt>/<check> ...]``.

    ``eager``: the module the model should compute (its weights are then the oracle's, and
    the differential check runs); without it the parameters are read from the graph.
    Raises ModelError (properties.onnx.model_file) for a file that is not an attention model.
    """
    info = read_interface(path, mapping=mapping, d_model=d_model, n_head=n_head, declared=declared)
    label = name or info.label
    if eager is not None:
        info = with_eager(info, eager)
    results = [interface_result(info, label)]
    params = eager.params() if eager is not None else params_from_graph(info)
    params = params.to(params.w_q.dtype)  # detached
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # examples are tiny: threads only contend with onnxruntime's
    try:
        for provider in providers:
            for opt in opt_levels:
                target = OrtTarget(info, params, provider, opt)
                for check in checks or checks_for(eager is not None):
                    results.append(check_target(target, check, settings=settings, label=label, seed=seed,
                                                eager=eager, bundle_dir=bundle_dir))
    finally:
        torch.set_num_threads(threads)
    return results


def validation_tasks(
    path: str | os.PathLike[str], info: Interface, *, profile: str, providers: Sequence[str] = ("cpu",),
    opt_levels: Sequence[str] = tuple(OPT_LEVELS), max_examples: int | None = None, database: str | None = None,
    seed: int | None = None, target_spec: str | None = None, weights: str | None = None, weight_seed: int = 0,
    mapping: dict[str, str] | None = None, bundle_dir: str | None = None, name: str | None = None,
    max_external_bytes: int | None = None, declared: dict[str, str] | None = None, adapter: str | None = None,
) -> list[Task]:
    """The checks of :func:`validate_model` as gate tasks for the isolation path.

    With ``weights`` (or a ``target_spec``) the eager target is loaded in the worker: its
    weights are the oracle's and the differential check runs.
    """
    label = name or info.label
    eager = weights is not None or target_spec is not None
    common = dict(model=str(Path(path).resolve()), profile=profile, max_examples=max_examples, database=database,
                  seed=seed, target_spec=target_spec, weights=weights, weight_seed=weight_seed,
                  mapping=mapping or {}, d_model=info.d_model, n_head=info.n_head, bundle_dir=bundle_dir,
                  max_external_bytes=max_external_bytes, declared=declared or {}, label=label, adapter=adapter)
    examples = max_examples or profiles.PROFILES[profile].max_examples
    return [Task(f"{label}/{provider}/{opt}/{check}", STAGE, "onnx_check",
                 dict(common, provider=provider, opt=opt, check=check), examples=examples)
            for provider in providers for opt in opt_levels for check in checks_for(eager)]


def run_onnx_check(*, model: str, check: str, provider: str, opt: str, settings: Settings, seed: int | None,
                   target_spec: str | None, weights: str | None, weight_seed: int, mapping: dict[str, str],
                   d_model: int | None, n_head: int | None, bundle_dir: str | None, label: str,
                   max_external_bytes: int | None = None, declared: dict[str, str] | None = None,
                   adapter: str | None = None) -> CheckResult:
    """One validation task (what ``mha_verify.gate.onnx_check`` runs in the worker)."""
    info = read_interface(model, mapping=mapping, d_model=d_model, n_head=n_head, declared=declared)
    eager = None
    if weights is not None or target_spec is not None:
        eager = load_eager(info, target_spec=target_spec, weights=weights, weight_seed=weight_seed, adapter=adapter)
        info = with_eager(info, eager)
    params = eager.params() if eager is not None else params_from_graph(info, max_external_bytes=max_external_bytes)
    params = params.to(params.w_q.dtype)  # detached
    torch.set_num_threads(1)
    return check_target(OrtTarget(info, params, provider, opt), check, settings=settings, label=label,
                        seed=seed, eager=eager, bundle_dir=bundle_dir)
