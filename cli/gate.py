"""The gate's units of work, as plain functions of picklable arguments (run in a worker process
by mha_verify.isolation, or in-process), and the Hypothesis settings they share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import settings as Settings

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.databases import open_database
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.targets.eager import load_target

if TYPE_CHECKING:
    import torch

    from mha_verify.properties.strategies.examples import AttnExample


def make_settings(profile: str, *, max_examples: int | None = None, database: str | None = None) -> Settings:
    """The profile's settings, with an example count override and an example database (a
    folder or a Redis URL, see :mod:`mha_verify.properties.engine.databases`).

    Hypothesis forbids a database with derandomize=True, so with ``database`` the ci profile
    becomes random generation from a fixed seed (see ``seed_for``): as deterministic, and
    a failure stored in the database is replayed first on the next run.
    """
    settings = profiles.PROFILES[profile]
    if max_examples is not None:
        settings = Settings(settings, max_examples=max_examples)
    if database is not None:
        settings = Settings(settings, derandomize=False, database=open_database(database))
    return settings


def seed_for(profile: str, seed: int | None, database: str | None) -> int | None:
    """The Hypothesis seed: the user's, else 0 where a database replaced derandomization."""
    if seed is not None:
        return seed
    if database is not None and profiles.PROFILES[profile].derandomize:
        return 0
    return None


def property_check(*, target_spec: str | None, adapter: str | None, name: str, profile: str, max_examples: int | None,
                   database: str | None, seed: int | None, replay: str | None,
                   dtype: str = "float32", bundle_dir: str | None = None) -> list[CheckResult]:
    """One property against the target, in ``dtype`` ("float32", "float16" or "bfloat16"); a
    failure's reproduction bundle under ``bundle_dir`` (:mod:`mha_verify.eager_bundle`)."""
    import torch

    from mha_verify.properties.engine.runner import run_property
    from mha_verify.properties.invariants.suite import all_properties

    settings = make_settings(profile, max_examples=max_examples, database=database)
    target = load_target(target_spec, adapter=adapter)

    def bundle(result: CheckResult, ex: AttnExample, run_dtype: torch.dtype) -> str:
        from mha_verify.eager_bundle import write_eager_bundle

        assert bundle_dir is not None
        try:
            return write_eager_bundle(bundle_dir, target, result, ex, run_dtype)
        except Exception as exc:  # the check's verdict stands; the report says the bundle is missing
            return f"no bundle: writing it raised {type(exc).__name__}: {exc}"

    return [run_property(all_properties()[name], target, settings=settings,
                         seed=seed_for(profile, seed, database), replay=replay, dtype=getattr(torch, dtype),
                         on_failure=bundle if bundle_dir else None)]


def search_round(*, target_spec: str | None, adapter: str | None, name: str, max_examples: int, database: str,
                 seed: int, threads: int = 1, dtype: str = "float32") -> list[CheckResult]:
    """One round of a continuous search (:mod:`mha_verify.search`): property ``name``, ``max_examples``
    random examples drawn from ``seed``, the stored failures of ``database`` replayed first and
    every new one saved there. Runs where a search engine's worker calls it, with ``threads`` of torch."""
    import warnings

    import torch
    from hypothesis.errors import HypothesisDeprecationWarning

    torch.set_num_threads(threads)
    # the engine's own threads (a Dask worker's heartbeat) use the random module while Hypothesis
    # draws, which it takes for a strategy using it; the examples are drawn as in any other check
    warnings.filterwarnings("ignore", "Do not use the `random` module inside strategies",
                            HypothesisDeprecationWarning)
    return property_check(target_spec=target_spec, adapter=adapter, name=name, profile="thorough",
                          max_examples=max_examples, database=database, seed=seed, dtype=dtype,
                          replay=_search_replay(target_spec, adapter, name, database))


def _search_replay(target_spec: str | None, adapter: str | None, name: str, database: str) -> str:
    import shlex

    from mha_verify.properties.engine.databases import redact

    parts = ["mha-verify", "check", "--no-export", "--only", name, "--database", redact(database)]
    parts += ["--target", target_spec] if target_spec else []
    parts += ["--adapter", adapter] if adapter else []
    return shlex.join(parts)


def export_checks(*, target_spec: str | None, adapter: str | None, profile: str, max_examples: int | None,
                  database: str | None, bundle_dir: str | None,
                  exporters: tuple[str, ...] | None = None) -> list[CheckResult]:
    """The export stage: ``exporters`` (default both), each model validated in onnxruntime."""
    from mha_verify.export.opsets import EXPORTERS
    from mha_verify.export_stage import export_stage

    settings = make_settings(profile, max_examples=max_examples, database=database)
    return export_stage(load_target(target_spec, adapter=adapter), settings=settings, bundle_dir=bundle_dir,
                        exporters=EXPORTERS if exporters is None else exporters)


def onnx_check(*, model: str, check: str, provider: str, opt: str, profile: str, max_examples: int | None,
               database: str | None, seed: int | None, target_spec: str | None, weights: str | None,
               weight_seed: int, mapping: dict[str, str], d_model: int | None, n_head: int | None,
               bundle_dir: str | None, label: str, max_external_bytes: int | None = None,
               declared: dict[str, str] | None = None, adapter: str | None = None) -> list[CheckResult]:
    """One check (a property, or ort_vs_eager) of an ONNX model in one (provider, optimization level)."""
    from mha_verify.validation import run_onnx_check

    settings = make_settings(profile, max_examples=max_examples, database=database)
    return [run_onnx_check(model=model, check=check, provider=provider, opt=opt, settings=settings,
                           seed=seed_for(profile, seed, database), target_spec=target_spec, weights=weights,
                           weight_seed=weight_seed, mapping=mapping, d_model=d_model, n_head=n_head,
                           bundle_dir=bundle_dir, label=label, max_external_bytes=max_external_bytes,
                           declared=declared, adapter=adapter)]


def probe_eager(*, model: str, target_spec: str | None, weights: str | None, weight_seed: int,
                mapping: dict[str, str], d_model: int | None, n_head: int | None,
                declared: dict[str, str] | None = None, adapter: str | None = None) -> list[CheckResult]:
    """Load the eager target at an ONNX model's sizes, with its weights file (``validate``'s check
    before it starts): pass, or fail with the usage error's message."""
    from mha_verify.properties.onnx.interface import read_interface
    from mha_verify.properties.onnx.model_file import ModelError
    from mha_verify.properties.protocol import TargetError
    from mha_verify.validation import load_eager

    try:
        info = read_interface(model, mapping=mapping, d_model=d_model, n_head=n_head, declared=declared)
        load_eager(info, target_spec=target_spec, weights=weights, weight_seed=weight_seed, adapter=adapter)
    except (TargetError, ModelError, ValueError) as exc:
        return [CheckResult("eager", "load", "fail", reason=str(exc), details={"usage": True})]
    return [CheckResult("eager", "load", "pass", reason=target_spec or "mha_verify.mha:MultiHeadAttention")]


def probe_mask_kind(*, model: str, mapping: dict[str, str], d_model: int | None, n_head: int | None,
                    declared: dict[str, str], target_spec: str | None, weights: str | None,
                    weight_seed: int, adapter: str | None = None) -> list[CheckResult]:
    """Ask the model which mask kind it computes (:func:`properties.onnx.probe.probe_mask`), and the
    eager target its conventions: pass, with ``{"probe": ..., "eager": {...}}`` as the reason, JSON
    (probe ``null`` without a mask input, eager ``{}`` without an eager target)."""
    import dataclasses
    import json

    from mha_verify.properties.onnx.conventions import eager_conventions
    from mha_verify.properties.onnx.interface import read_interface
    from mha_verify.properties.onnx.model_file import ModelError
    from mha_verify.properties.onnx.ort_target import OrtInstance, make_session, params_from_graph
    from mha_verify.properties.onnx.probe import probe_mask
    from mha_verify.properties.protocol import TargetError
    from mha_verify.validation import load_eager, with_eager

    try:
        info = read_interface(model, mapping=mapping, d_model=d_model, n_head=n_head, declared=declared)
        eager: dict[str, str] = {}
        if weights is not None or target_spec is not None:
            bound = load_eager(info, target_spec=target_spec, weights=weights, weight_seed=weight_seed, adapter=adapter)
            info, params = with_eager(info, bound), bound.params()
            eager = eager_conventions(bound.conventions)
        else:
            params = params_from_graph(info)
    except (TargetError, ModelError, ValueError) as exc:
        return [CheckResult("mask_probe", "load", "fail", reason=str(exc), details={"usage": True})]
    found = None
    if info.mask is not None:  # the model as written: optimizations are what the checks judge, per level
        found = probe_mask(OrtInstance(info, make_session(model, opt="opt-none"), params.to(params.w_q.dtype)))
    return [CheckResult("mask_probe", "load", "pass",
                        reason=json.dumps({"probe": None if found is None else dataclasses.asdict(found),
                                           "eager": eager}))]


def probe_target(*, target_spec: str | None, adapter: str | None) -> list[CheckResult]:
    """Load and build the target (what the CLI checks before it starts): pass with its spec as the
    reason, or fail with the usage error's message."""
    from mha_verify.properties.protocol import TargetError

    try:
        spec = load_target(target_spec, adapter=adapter).spec
    except (TargetError, ValueError) as exc:
        return [CheckResult("target", "load", "fail", reason=str(exc), details={"usage": True})]
    return [CheckResult("target", "load", "pass", reason=spec)]
