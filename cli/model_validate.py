"""``mha-verify validate MODEL.onnx --eager DIR_OR_SPEC`` for a whole exported model that takes
token ids: its inputs read from their names, then each check of
:mod:`mha_verify.properties.model.checks` over generated batches in onnxruntime, held against the
eager model it was exported from. Exit 0 every check passed (findings and n/a said), 1 a check
failed or none passed, 2 a usage error (one line naming the input, the flag or the file).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mha_verify import report_text
from mha_verify.escape import printable
from mha_verify.exit_codes import usage_error, verdicts_exit
from mha_verify.properties.engine.results import CheckResult

if TYPE_CHECKING:
    import onnx

    from mha_verify.properties.model.checks import ModelUnderTest
    from mha_verify.properties.model.eager import AttentionDims
    from mha_verify.properties.model.graph_blocks import Block
    from mha_verify.properties.model.replay import Replay
    from mha_verify.properties.model.runner import ReplayWriter


#: the attention-layer validation a cut block goes through (``export_cmds.layer_results``, handed in
#: by the caller: this module is imported by ``export_cmds``, and imports nothing back)
LayerResults = Callable[..., "list[CheckResult] | int"]


def validate_model(args: argparse.Namespace, layer_results: LayerResults) -> int:
    import torch
    from hypothesis import settings as Settings

    from mha_verify.properties.engine import profiles
    from mha_verify.properties.model.checks import ModelUnderTest
    from mha_verify.properties.model.eager import load_eager_model
    from mha_verify.properties.model.graph_blocks import (
        attention_blocks,
        padding_precondition,
        tokens_precondition,
    )
    from mha_verify.properties.model.inputs import parse_model_inputs, read_model_inputs
    from mha_verify.properties.model.runner import CHECKS, run_check
    from mha_verify.properties.onnx.model_file import ModelError, load_model
    from mha_verify.properties.onnx.ort_target import make_session
    from mha_verify.properties.protocol import TargetError

    try:
        if not args.eager:
            raise ModelError(f"{args.model} takes token ids: a whole model, validated against the model it was "
                             "exported from; pass --eager DIR (its save_pretrained folder) or --eager "
                             "module:factory")
        only = [c.strip() for c in (args.only or "").split(",") if c.strip()] or list(CHECKS)
        unknown = [c for c in only if c not in CHECKS]
        if unknown:
            raise ValueError(f"--only names {', '.join(unknown)}, not a whole-model check; choose from "
                             f"{', '.join(CHECKS)}")
        settings = profiles.PROFILES[profiles.profile_name(args.profile)]
        if args.max_examples is not None:
            settings = Settings(settings, max_examples=args.max_examples)
        model = load_model(args.model, external_data=False, max_external_bytes=int(args.max_external_data_gb * 2**30))
        inputs = read_model_inputs(model, Path(args.model), parse_model_inputs(args.model_inputs))
        eager = load_eager_model(args.eager, getattr(torch, inputs.precision))
        blocks = attention_blocks(model)
        mut = ModelUnderTest(make_session(args.model), inputs, eager, precondition=padding_precondition(blocks),
                             needs_tokens=tokens_precondition(blocks))
        mut.empty_cache(1)  # a decoder's cache sizes are known before any check runs
        mut.read_claims()
    except (ModelError, TargetError, ValueError, OSError) as exc:
        return usage_error(str(exc))
    except Exception as exc:  # onnxruntime refusing the file, the eager model failing its first call
        return usage_error(f"loading {args.model} or its eager model failed: {type(exc).__name__}: "
                           f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}")
    precision = "" if inputs.precision == "float32" else (
        f"; computes in {inputs.precision}: the allowance comes from the eager model in {inputs.precision}")
    print(printable(f"{args.model}: a whole model taking token ids{precision}; inputs {inputs.describe()}; outputs "
                    f"{', '.join(inputs.outputs)}; eager {eager.source} (vocabulary {eager.vocab_size}, lengths to "
                    f"{eager.max_length}); padding kept by the eager model on: "
                    f"{', '.join(side for side, why in mut.keeps.items() if not why)}"
                    + "".join(f"; not {side}: {why}" for side, why in mut.keeps.items() if why)))
    print(printable(f"attention blocks in the graph: {len(blocks)}"
                    + "".join(f"\n  {block.describe()}" for block in blocks)
                    + ("\n  (no fused attention node: the attention is in plain ONNX ops)" if not blocks else "")
                    + "".join(f"\n  precondition: {why}" for why in (mut.precondition, mut.needs_tokens) if why)))
    results: list[CheckResult] = []
    total = len(only) + (len(blocks) if args.blocks else 0)
    for name in only:
        print(f"  [{len(results) + 1}/{total}] running model/{name} ...", file=sys.stderr, flush=True)
        results.append(run_check(name, mut, settings, _replay_writer(args, mut)))
    if args.blocks:
        agrees = next((r.verdict in ("pass", "finding") for r in results if r.name == "outputs_agree"), None)
        results += _verify_blocks(args, layer_results, model, blocks, eager.dims, agrees, len(results), total)
    print(printable("\n".join((report_text.table(results, "validate"), report_text.failures(results),
                                report_text.findings(results), report_text.summary(results)))))
    return verdicts_exit(results, passing=("pass",))


def _replay_writer(args: argparse.Namespace, mut: ModelUnderTest) -> ReplayWriter | None:
    """Writes a failure's replay as a reproduction bundle under ``--bundle-dir`` (None without it)."""
    if not args.bundle_dir:
        return None
    from mha_verify.repro_bundle import write_bundle

    def write(name: str, replay: Replay, counterexample: str, reason: str) -> str:
        try:  # what onnxruntime returns on the feed, kept beside the expected
            actual = mut.session.run([replay.output], replay.feed)[0]
        except Exception:
            actual = None
        folder = write_bundle(args.bundle_dir, name=name, model_path=args.model, feed=replay.feed,
                              expected=replay.expected, actual=actual, allowed=replay.allowed,
                              provider="CPUExecutionProvider", opt_level="opt-all", output=replay.output,
                              counterexample=counterexample, verdict=reason, where=replay.where)
        return f"python {folder / 'replay.py'}"

    return write


def _verify_blocks(args: argparse.Namespace, layer_results: LayerResults, model: onnx.ModelProto,
                   blocks: list[Block], dims: AttentionDims, agrees: bool | None, done: int,
                   total: int) -> list[CheckResult]:
    """Each fused attention block, one result named by its node. A block whose attributes state another
    attention than the eager model's config (``dims``: heads, scale) fails where the whole model
    disagrees with its eager model too (``agrees`` False: the block is where); where the whole model
    agrees, the model evidently scales otherwise and that is said. Each block is then cut out with its
    projections and held to the oracle by the property registry
    (``layer_results``): fail where any of its checks failed (named),
    pass where its checks passed, n/a where it cannot be cut (the reason)."""
    import tempfile
    import time

    import onnx

    from mha_verify.properties.model.block_cut import cut_block
    from mha_verify.properties.model.graph_blocks import disagreements
    from mha_verify.properties.onnx.model_file import ModelError, load_model

    if blocks and any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        # a cut keeps the weights it computes with (the size was checked when the graph was read)
        model = load_model(args.model, max_external_bytes=int(args.max_external_data_gb * 2**30))
    results: list[CheckResult] = []
    with tempfile.TemporaryDirectory(prefix="mha-verify-blocks-") as folder:
        for i, block in enumerate(blocks):
            name = f"block {block.name}"
            print(f"  [{done + i + 1}/{total}] running {name} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            differs = disagreements(block, dims)
            if differs and agrees is False:
                results.append(CheckResult(name, "blocks", "fail", seconds=time.perf_counter() - start,
                                           reason=f"{block.describe()}: {'; '.join(differs)}: the node computes "
                                                  "another attention than its eager model's (the registry was not "
                                                  "run on it)"))
                continue
            try:
                cut = cut_block(model, block, Path(folder) / f"block{i}.onnx", dims)
            except ModelError as exc:
                results.append(CheckResult(name, "blocks", "n/a", reason=str(exc)))
                continue
            checks = layer_results(argparse.Namespace(**{**vars(args), **_LAYER_DEFAULTS, "model": str(cut.path)}),
                                   quiet=True)
            whole = {True: "while the whole model agrees with its eager model",
                     False: "where the whole model disagrees with its eager model too",
                     None: "outputs_agree not run"}[agrees]
            said = [*differs, *cut.notes]
            note = f" ({'; '.join(said)}, {whole})" if said else ""
            results.append(_block_result(name, block.describe() + note, checks, time.perf_counter() - start))
    return results


#: a cut block is validated as an attention file with nothing declared: all it says is in the file
_LAYER_DEFAULTS = dict(eager=None, target=None, weights=None, inputs=None, d_model=None, n_head=None, layout=None,
                       mask_axes=None, mask_kind=None, conventions=None, require_dynamic=False, adapter=None)


def _block_result(name: str, what: str, checks: list[CheckResult] | int, seconds: float) -> CheckResult:
    if isinstance(checks, int):  # the cut file could not be read as an attention layer: ours to mend
        return CheckResult(name, "blocks", "error", seconds=seconds,
                           reason=f"{what}: mha-verify refused the block it cut out as an attention file "
                                  "(said above); the block has no verdict")
    failed = [c for c in checks if c.failed]
    passed = [c for c in checks if c.verdict == "pass"]
    names = ", ".join(dict.fromkeys(c.name.split("/")[-1] for c in failed))  # one per property, not per variant
    counts = f"{len(passed)} of {len(checks)} checks passed, {len(failed)} failed"
    if failed:
        first = failed[0]
        return CheckResult(name, "blocks", "fail", examples=sum(c.examples for c in checks), seconds=seconds,
                           worst_error=first.worst_error, allowed=first.allowed, counterexample=first.counterexample,
                           reason=f"{what}: {counts} ({names}); "
                                  f"{first.name.split('/')[-1]}: {first.reason}")
    errored = [c for c in checks if c.errored]
    if errored:  # a check of ours raised on the block: the block has no verdict
        return CheckResult(name, "blocks", "error", seconds=seconds,
                           reason=f"{what}: {len(errored)} of {len(checks)} checks raised in mha-verify; "
                                  f"{errored[0].name.split('/')[-1]}: {errored[0].reason}")
    if not passed:
        return CheckResult(name, "blocks", "n/a", seconds=seconds, reason=f"{what}: no check of the registry passed")
    worst = max(passed, key=lambda c: (c.worst_error or 0.0) / (c.allowed or 1.0))
    findings = [c for c in checks if c.verdict == "finding"]
    if findings:  # said as the block's verdict, not folded into a pass
        first = findings[0]
        kinds = ", ".join(dict.fromkeys(f"{c.name.split('/')[-1]} ({c.kind_label})" for c in findings))
        return CheckResult(name, "blocks", "finding", kind=first.kind, examples=sum(c.examples for c in passed),
                           seconds=seconds, worst_error=worst.worst_error, allowed=worst.allowed,
                           reason=f"{what}: {counts}, {len(findings)} findings ({kinds}); "
                                  f"{first.name.split('/')[-1]}: {first.reason}")
    return CheckResult(name, "blocks", "pass", examples=sum(c.examples for c in passed), seconds=seconds,
                       worst_error=worst.worst_error, allowed=worst.allowed,
                       reason=f"{what}: {counts} (held to the float64 oracle with the node's weights)")
