"""The export stage of ``mha-verify check``: export a target once per configuration at a
modest size, then validate each model: the property registry against each onnxruntime
target variant, and onnxruntime against the eager module (:mod:`mha_verify.validation`).

The default configurations — the dynamo exporter at its newest opset (which uses the ONNX
``Attention`` operator from opset 23) and the TorchScript exporter at its newest. Each model
gets the whole registry (and ``ort_vs_eager``) at onnxruntime's full optimization level, the
graph deployments run, and only :data:`UNOPTIMIZED_CHECKS` with optimizations off: the
optimization level changes which kernels and fusions compute the function (its numbers,
fully masked rows), not the graph's structure that the symmetry and masking invariants are
about, and the whole registry at both levels costs about six times the two exports (78 s
against 13 s at ci on 2 cores). ``mha-verify validate`` runs it at both. Ask for more with
``opsets`` and ``dtypes``.

Each check here runs half the profile's examples (:data:`EXAMPLES_SHARE`; 50 at ``ci``, of
which 32 sweep the length and batch boundaries): an exported model is fixed in d_model, n_head
and weights, so its examples vary batch, lengths and masks only, and the same properties have
just run at the full count on the eager layer at every size. ``mha-verify validate``, the
command for a model on its own, runs the full count.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from hypothesis import settings as Settings

from mha_verify.export.onnx_export import ExportError, export_onnx, model_label
from mha_verify.export.opsets import EXPORTERS, check_opset
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.targets.eager import Target
from mha_verify.validation import STAGE, validate_model

STAGE_D_MODEL, STAGE_N_HEAD = 16, 4
UNOPTIMIZED_CHECKS = ("oracle_agreement", "fully_masked_rows", "ort_vs_eager")
EXAMPLES_SHARE = 0.5  # of the profile's examples, for each check of an exported model


def export_stage(
    target: Target,
    *,
    settings: Settings,
    exporters: Sequence[str] = EXPORTERS,
    opsets: Sequence[int | None] = (None,),
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    bundle_dir: str | Path | None = None,
    providers: Sequence[str] = ("cpu",),
    d_model: int = STAGE_D_MODEL,
    n_head: int = STAGE_N_HEAD,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[CheckResult]:
    """Export ``target`` with each (exporter, opset, dtype) and validate each model.

    ``opsets`` entries of None mean the exporter's newest; an opset an exporter cannot
    write gives an "n/a" result for that exporter. An export that fails gives a failed
    ``<label>/export`` result (the target cannot be deployed that way) and no validation.
    """
    results: list[CheckResult] = []
    settings = Settings(settings, max_examples=max(1, math.ceil(settings.max_examples * EXAMPLES_SHARE)))
    with tempfile.TemporaryDirectory(prefix="mha-verify-export-") as tmp:
        for exporter in exporters:
            for opset in opsets:
                try:
                    real_opset = check_opset(exporter, opset)
                except ValueError as exc:
                    results.append(CheckResult(f"{exporter}-opset{opset}/export", STAGE, "n/a", reason=str(exc)))
                    continue
                for dtype in dtypes:
                    label = model_label(exporter, real_opset, dtype)
                    try:
                        bound = target.build(d_model, n_head, seed=seed, dtype=dtype)
                    except TargetError as exc:
                        results.append(CheckResult(f"{label}/export", STAGE, "fail", reason=str(exc)))
                        continue
                    if progress:
                        progress(f"{label} (export, then validation)")
                    path = Path(tmp) / f"{label}.onnx"
                    start = time.perf_counter()
                    try:
                        exported = export_onnx(bound, path, exporter=exporter, opset=real_opset, dtype=dtype,
                                           target_spec=target.spec)
                    except ExportError as exc:
                        results.append(CheckResult(f"{label}/export", STAGE, "fail",
                                                   seconds=time.perf_counter() - start, reason=str(exc)))
                        continue
                    results.append(CheckResult(f"{label}/export", STAGE, "pass", seconds=exported.seconds,
                                               details={"d_model": d_model, "n_head": n_head}))
                    results += validate_model(path, eager=bound, settings=settings, providers=providers,
                                              bundle_dir=bundle_dir, name=label, opt_levels=("opt-all",))
                    results += validate_model(path, eager=bound, settings=settings, providers=providers,
                                              bundle_dir=bundle_dir, name=label, opt_levels=("opt-none",),
                                              checks=UNOPTIMIZED_CHECKS)[1:]  # the interface once
    return results
