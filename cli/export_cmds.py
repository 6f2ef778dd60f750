"""The ``mha-verify export`` and ``mha-verify validate`` subcommands.

Wire into the main parser with ``export_cmds.add_parsers(subparsers)``; each subcommand sets
``func`` to a handler ``(args) -> exit code``: 0 every check passed, 1 a check failed (for
``export``: and nothing was written), 2 usage error (one line on stderr, no traceback, no
file). Handlers catch their own usage errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mha_verify.arg_types import finite_positive, positive_int, positive_seconds, process_count, seed
from mha_verify.escape import printable
from mha_verify.exit_codes import EXIT_FAIL, EXIT_OK, usage_error, verdicts_exit
from mha_verify.properties.engine.results import CheckResult

if TYPE_CHECKING:
    from mha_verify.properties.onnx.interface import Interface
    from mha_verify.properties.onnx.probe import MaskProbe


class _Abort(Exception):  # noqa: N818 -- control flow, not an error
    """Validation failed: leave no file."""


def format_results(results: Sequence[CheckResult], title: str | None = None) -> str:
    """The CLI's text report: a table per stage (titled ``title`` where given: what the command did),
    each failure in full, a summary line."""
    from mha_verify import report_text

    return "\n".join((report_text.table(results, title), report_text.failures(results),
                      report_text.findings(results), report_text.summary(results)))


def _providers(text: str) -> list[str]:
    from mha_verify.properties.onnx.ort_target import PROVIDERS, available_providers

    wanted = [p.strip() for p in text.split(",") if p.strip()]
    have = available_providers()
    for p in wanted:
        if p not in PROVIDERS:
            raise ValueError(f"unknown provider {p!r}; known: {', '.join(PROVIDERS)}")
        if p not in have:
            raise ValueError(f"provider {p!r} is not available in this onnxruntime; available: {', '.join(have)}")
    if not wanted:
        raise ValueError("--providers is empty")
    return wanted


def cmd_export(args: argparse.Namespace) -> int:
    """Export, validate in a temp file next to the output, then move it into place."""
    from mha_verify.export.atomic import AtomicWriter, atomic_path
    from mha_verify.export.onnx_export import DTYPES, ExportError, export_onnx
    from mha_verify.export.opsets import check_opset
    from mha_verify.properties.engine import profiles
    from mha_verify.properties.onnx.model_file import ModelError
    from mha_verify.properties.protocol import TargetError
    from mha_verify.properties.targets.eager import load_target, load_weights
    from mha_verify.validation import validate_model

    try:
        opset = check_opset(args.exporter, args.opset)
        settings = profiles.PROFILES[profiles.profile_name(args.profile)]
        dtype = DTYPES[args.dtype]
        out = Path(args.output)
        if args.graph != "torch":  # a non-standard graph is labelled in its file name too
            from mha_verify.export.contrib_graph import contrib_file_name

            out = out.with_name(contrib_file_name(out.name))
        if not args.output:
            raise ValueError("-o/--output is an empty path")
        AtomicWriter(out)  # a directory, a missing or read-only folder: refused now, before any work
        target = load_target(args.target, adapter=args.adapter)
        bound = target.build(args.d_model, args.n_head, seed=args.weight_seed, dtype=dtype)
        if args.weights is not None:
            load_weights(bound, args.weights, dtype)
        if not args.no_mask_input and not bound.conventions.mask:
            raise ValueError(f"{args.target} takes no mask, so the graph cannot have a mask input: pass "
                             "--no-mask-input (inputs q, k, v only)")
    except (TargetError, ModelError, ValueError, TypeError, OSError) as exc:
        return usage_error(str(exc))
    try:
        with atomic_path(out) as tmp:
            exported = export_onnx(bound, tmp, exporter=args.exporter, opset=opset, dtype=dtype,
                                   target_spec=target.spec, mask_input=not args.no_mask_input, graph=args.graph)
            results = validate_model(tmp, eager=bound, settings=settings, bundle_dir=args.bundle_dir,
                                     name=exported.label)
            print(printable(format_results(results)))
            if any(r.failed or r.errored for r in results):
                raise _Abort
    except ExportError as exc:
        print(printable(f"mha-verify: export failed: {exc}"), file=sys.stderr)
        return EXIT_FAIL
    except _Abort:
        code = verdicts_exit(results)
        print(f"mha-verify: validation {'failed' if code == EXIT_FAIL else 'did not finish'}; {str(out)!r} was not "
              "written", file=sys.stderr)
        return code
    print(f"wrote {out}")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate any attention ONNX model: its interface, the property registry in onnxruntime (each
    provider and optimization level a target), and onnxruntime against the eager target when one
    is given; each check a task of the gate's isolation path (a crash or hang is that check's failure).
    """
    from mha_verify.properties.model.inputs import takes_token_ids
    from mha_verify.properties.onnx.model_file import ModelError, load_model

    try:
        whole = takes_token_ids(load_model(args.model, external_data=False,
                                           max_external_bytes=int(args.max_external_data_gb * 2**30)))
    except (ModelError, OSError) as exc:
        return usage_error(str(exc))
    if whole:  # a whole text model: its own inputs, checks and eager model
        from mha_verify.model_validate import validate_model

        return validate_model(args, layer_results)
    if args.model_inputs or args.only or args.max_examples is not None or not args.blocks:
        return usage_error("--model-inputs, --only, --max-examples and --no-blocks are for a whole model taking "
                           f"token ids; {args.model} is an attention layer (map its inputs with --inputs)")
    if args.eager is not None and args.target is None and args.weights is None:
        args.target = args.eager  # a layer's eager model is its --target
    done = layer_results(args)
    if isinstance(done, int):
        return done
    print(printable(format_results(done, title="validate")))  # its checks' stage is "export" in reports
    return verdicts_exit(done)


def layer_results(args: argparse.Namespace, *, quiet: bool = False) -> list[CheckResult] | int:
    """The interface result and every check's result of the attention layer file ``args.model``, or the
    usage error's exit code (its line said); ``quiet``: the interface is not printed."""
    from mha_verify.isolation import Limits, default_jobs, probe, run_tasks
    from mha_verify.properties.engine import profiles
    from mha_verify.properties.onnx.conventions import adopt_conventions
    from mha_verify.properties.onnx.interface import parse_input_map, read_interface
    from mha_verify.properties.onnx.model_file import ModelError, load_model
    from mha_verify.properties.onnx.ort_target import params_from_graph
    from mha_verify.properties.onnx.probe import MaskProbe, describe_probe
    from mha_verify.properties.onnx.reading import parse_conventions
    from mha_verify.properties.protocol import TargetError
    from mha_verify.validation import interface_result, load_eager, validation_tasks

    try:
        providers = _providers(args.providers)
        profile = profiles.profile_name(args.profile)
        mapping = parse_input_map(args.inputs)
        declared = {key: value for key, value in (("layout", args.layout), ("mask_axes", args.mask_axes),
                                                  ("mask_kind", args.mask_kind)) if value is not None}
        declared.update(parse_conventions(args.conventions))
        max_external = int(args.max_external_data_gb * 2**30)
        load_model(args.model, external_data=False, max_external_bytes=max_external)  # refused here if too large
        info = read_interface(args.model, mapping=mapping, d_model=args.d_model, n_head=args.n_head,
                              declared=declared)
        if info.d_model is None or info.n_head is None:
            raise ModelError(f"cannot tell d_model and n_head of {args.model} (d_model={info.d_model}, "
                             f"n_head={info.n_head}): pass --d-model and --n-head")
        eager = args.weights is not None or args.target is not None
        if eager and args.isolate:  # its import runs isolated: a crash or exit there is a usage error
            probe("probe_eager", dict(model=args.model, target_spec=args.target, weights=args.weights,
                                      weight_seed=args.weight_seed, mapping=mapping, d_model=args.d_model,
                                      n_head=args.n_head, declared=declared, adapter=args.adapter),
                  what="the eager target",
                  timeout=args.timeout)
        elif eager:
            load_eager(info, target_spec=args.target, weights=args.weights, weight_seed=args.weight_seed,
                       adapter=args.adapter)
        else:
            params_from_graph(info, max_external_bytes=max_external)
        # the model asked its mask kind, the eager target its conventions
        probed, adopted = _mask_probe(args, mapping, declared) if eager or info.mask is not None else (None, {})
        info = adopt_conventions(info, adopted, "the eager target")
        found = probed if isinstance(probed, MaskProbe) else None
        usage, problem = (None, None) if found is None else describe_probe(
            found, info.reading.mask_kind_source, info.reading.declared_kind, info.mask.name if info.mask else "")
        if usage:
            raise ModelError(usage)
        if args.bundle_dir:
            Path(args.bundle_dir).mkdir(parents=True, exist_ok=True)
    except (TargetError, ModelError, ValueError, OSError) as exc:
        return usage_error(str(exc))
    if not quiet:
        print(printable(info.describe()))
    tasks = validation_tasks(args.model, info, profile=profile, providers=providers, target_spec=args.target,
                             weights=args.weights, weight_seed=args.weight_seed, mapping=mapping,
                             bundle_dir=args.bundle_dir, max_external_bytes=max_external, declared=declared,
                             adapter=args.adapter)
    limits = Limits(timeout=args.timeout) if args.isolate else None
    if problem:  # each check would be judged under a mask kind the model contradicts, and fail for it (slowly)
        problem += "; no check was run under a reading the model contradicts"
    interface = interface_result(info, info.label, frozen="fail" if args.require_dynamic else "warn",
                                 problems=[problem] if problem else [],
                                 hints=[probed] if isinstance(probed, str) else _fully_masked_hint(found, info))
    results = [interface, *([] if problem else run_tasks(tasks, limits=limits, jobs=args.jobs or default_jobs()))]
    return results


def _fully_masked_hint(found: MaskProbe | None, info: Interface) -> list[str]:
    """A warning where the model's fully masked rows match a convention other than the one it is
    judged under (the fully_masked_rows property then fails; this line says what would declare it)."""
    if found is None or found.contradicted:
        return []
    judged = f"{found.read}/{info.conventions.get('fully_masked', ('zeros', ''))[0]}"
    others = [p for p in found.fully_masked if p != judged and p.split("/")[0] in (found.matches or (found.read,))]
    if not others or judged in found.fully_masked:
        return []
    flags = " or ".join(f"--mask-kind {p.split('/')[0]} --conventions fully_masked={p.split('/')[1]}" for p in others)
    return [f"fully masked rows: the model does not give {judged.split('/')[1]} there (judged as {judged}); they match "
            f"{flags}: if that is its convention, declare it"]


def _mask_probe(args: argparse.Namespace, mapping: dict[str, str],
                declared: dict[str, str]) -> tuple[MaskProbe | str | None, dict[str, str]]:
    """The model's answer to which mask kind it computes (:func:`mha_verify.gate.probe_mask_kind`),
    run isolated like every onnxruntime call, and the eager target's conventions ({} without one).

    The answer is a MaskProbe, None without a mask input, or why it could not run (onnxruntime
    crashed or hung: a warning, the checks then report it)."""
    import json

    from mha_verify import gate
    from mha_verify.isolation import probe
    from mha_verify.properties.onnx.probe import MaskProbe
    from mha_verify.properties.protocol import TargetError

    kwargs = dict(model=args.model, mapping=mapping, d_model=args.d_model, n_head=args.n_head, declared=declared,
                  target_spec=args.target, weights=args.weights, weight_seed=args.weight_seed, adapter=args.adapter)
    if args.isolate:
        try:
            text = probe("probe_mask_kind", kwargs, what="the mask probe", timeout=args.timeout)
        except TargetError as exc:
            if not str(exc).startswith("loading the mask probe failed"):
                raise  # a usage error of its own (the eager target, the weights)
            # onnxruntime crashed or hung on the model: the checks report that, each in its worker
            return str(exc).replace("loading the mask probe failed", "the mask probe could not run"), {}
    else:
        (result,) = gate.probe_mask_kind(**kwargs)
        if result.failed:
            raise TargetError(str(result.reason))
        text = str(result.reason)
    answer = json.loads(text)
    eager = {str(k): str(v) for k, v in answer["eager"].items()}
    found = answer["probe"]
    if found is None:
        return None, eager
    return MaskProbe(str(found["read"]), tuple(found["matches"]), tuple(found["fully_masked"]),
                     int(found["calls"])), eager


class _SeedMeansHypothesis(argparse.Action):
    """``--seed`` is the Hypothesis seed (``check``); here the weights' seed is ``--weight-seed``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error("--seed is the Hypothesis seed of `check`; the seed of the target's weights is --weight-seed")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, metavar="SPEC",
                   help="package.module:Attr or path/to/file.py:Attr (default: mha:MultiHeadAttention)")
    p.add_argument("--weights", default=None, metavar="FILE",
                   help="a state_dict for the target, loaded with torch.load(weights_only=True)")
    p.add_argument("--weight-seed", dest="weight_seed", type=seed, default=0, metavar="N",
                   help="seed of the target's initial weights, without --weights (default 0)")
    p.add_argument("--seed", action=_SeedMeansHypothesis, nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--profile", choices=("quick", "ci", "thorough"), default=None,
                   help="Hypothesis profile (default: $MHA_VERIFY_PROFILE or ci)")
    p.add_argument("--bundle-dir", default=None, metavar="DIR",
                   help="write a reproduction bundle for each failed check into DIR")


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``export`` and ``validate`` on the main parser's subparsers."""
    from mha_verify.export.opsets import EXPORTERS

    ex = subparsers.add_parser("export", help="export a target to ONNX; validated before it is written",
                               description="Export to ONNX, validate in onnxruntime, then write atomically. "
                                           "Exit 0 written, 1 a check failed (nothing written), 2 usage error.")
    _common(ex)
    ex.add_argument("--d-model", type=positive_int, required=True, help="model width D")
    ex.add_argument("--n-head", type=positive_int, required=True, help="number of heads H")
    ex.add_argument("--exporter", choices=EXPORTERS, default="dynamo", help="torch exporter (default dynamo)")
    ex.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the newest supported)")
    ex.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="model dtype")
    ex.add_argument("-o", "--output", required=True, metavar="model.onnx", help="where to write the model")
    ex.add_argument("--graph", choices=("torch", "ort-contrib"), default="torch",
                    help="torch: the exporter's standard ONNX (default); ort-contrib: onnxruntime's fused "
                         "com.microsoft.MultiHeadAttention (onnxruntime only; written as NAME.ort-contrib.onnx)")
    ex.add_argument("--adapter", default=None, help="force an adapter instead of finding one by structure: a "
                    "registered name (`mha-verify list` prints them all) or pkg.mod:YourAdapter")
    ex.add_argument("--no-mask-input", action="store_true",
                    help="write a mask-free graph (inputs q, k, v): for deployments that never mask")
    ex.set_defaults(func=cmd_export)

    va = subparsers.add_parser("validate", help="validate an ONNX model against a target in onnxruntime",
                               description="Exit 0 pass, 1 a check failed, 2 usage error.")
    va.add_argument("model", metavar="model.onnx")
    _common(va)
    va.add_argument("--adapter", default=None, help="the eager target's adapter, as for check and export: a "
                    "registered name or pkg.mod:YourAdapter (default: found by structure)")
    va.add_argument("--providers", default="cpu", help="comma-separated: cpu, cuda, tensorrt (default cpu)")
    va.add_argument("--d-model", type=positive_int, default=None, help="override d_model (default: from the model)")
    va.add_argument("--n-head", type=positive_int, default=None,
                    help="override n_head (default: from the model's metadata, attention op, mask or head split)")
    va.add_argument("--inputs", default=None, metavar="q=NAME,k=NAME,v=NAME,mask=NAME",
                    help="map the model's input names to roles q, k, v, x, mask (default: by name, then position)")
    va.add_argument("--no-isolation", dest="isolate", action="store_false",
                    help="run onnxruntime in this process (default: a child process, so a crash is a failure)")
    va.add_argument("--timeout", type=positive_seconds, default=600.0,
                    help="seconds before an isolated run counts as hung")
    va.add_argument("--max-external-data-gb", type=finite_positive, default=2.0, metavar="GB",
                    help="the most external data (tensors stored beside the model) read into memory (default 2)")
    va.add_argument("--jobs", type=process_count, default=None, help="worker processes running checks side by side "
                    "(default: one per core)")
    va.add_argument("--require-dynamic", action="store_true",
                    help="a batch or length axis fixed in the graph's inputs fails the interface check (default: a "
                    "warning, and the properties are judged at the fixed sizes)")
    va.add_argument("--layout", choices=("batch-first", "seq-first"), default=None,
                    help="q, k, v (or x) as (B, L, D) or (L, B, D) (default: read from the file's axis names and "
                    "shared axes; a usage error where it does not say)")
    va.add_argument("--mask-axes", default=None, metavar="AXES",
                    help="the mask input's axes, comma-separated from B, H, Lq, Lk, B*H: e.g. B,Lk (a key padding "
                    "mask), Lq,Lk, B*H,Lq,Lk (torch's 3-D attn_mask) (default: read from its rank, names and dims)")
    va.add_argument("--mask-kind", choices=("keep", "drop", "additive", "additive_min"), default=None,
                    help="bool: keep (True = may attend, ONNX's) or drop (True = masked out, torch MHA's); float: "
                    "additive (-inf removes) or additive_min (finfo.min removes, HF's) (default: read, else keep / "
                    "additive)")
    va.add_argument("--conventions", default=None, metavar="KEY=VALUE,...",
                    help="what the file cannot say: fully_masked=zeros|uniform|uniform_visible|nan (what a fully "
                    "masked row gives), "
                    "causal=true|false|bottom_right, scale=X (the softmax scale; default 1/sqrt(Hd) or the attention "
                    "operator's), rotary=BASE;INTERLEAVED;FRACTION;REVERSE (RoPE on q and k: 10000;false;1;false), "
                    "rows_unspecified=true (what a fully masked row gives is the runtime's to choose: finite is "
                    "required, another value is a finding)")
    va.add_argument("--eager", default=None, metavar="DIR_OR_SPEC",
                    help="the model the file was exported from: a transformers save_pretrained folder or "
                    "module:factory (for a whole model taking token ids; for a layer, the same as --target)")
    va.add_argument("--model-inputs", dest="model_inputs", default=None, metavar="ROLE=NAME,...",
                    help="a whole model's input roles where their names do not say: input_ids, attention_mask, "
                    "token_type_ids, position_ids")
    va.add_argument("--only", default=None, metavar="CHECK,...",
                    help="a whole model's checks to run: outputs_agree, padding_invariance, batch_independence, "
                    "fully_padded_finite, cache_consistency (default all)")
    va.add_argument("--no-blocks", dest="blocks", action="store_false",
                    help="a whole model: do not cut its fused attention blocks out to verify each with the property "
                    "registry (default: each is cut and verified)")
    va.add_argument("--max-examples", dest="max_examples", type=positive_int, default=None, metavar="N",
                    help="a whole model's generated batches per check (default: the profile's)")
    va.set_defaults(func=cmd_validate)
