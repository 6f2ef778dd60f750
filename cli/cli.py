"""The `mha-verify` command line: argument parsing, stages and exit codes.

Exit codes: 0 every check passed, 1 a check failed, 2 usage or input error (one line on
stderr, no traceback, no partial file). ``mha-verify`` with no subcommand runs ``check``.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

from mha_verify import VERSION_RULE, __version__
from mha_verify.arg_types import finite_positive, positive_int, process_count, seed
from mha_verify.escape import printable
from mha_verify.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE
from mha_verify.shards import parse_shard

SUBCOMMANDS = ("check", "export", "validate", "sweep", "merge", "search", "list")


class UsageError(Exception):
    """A usage or input error: reported on one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    from mha_verify.properties.engine.profiles import PROFILES

    p = sub.add_parser("check", help="run every property (and the export stage) against a target",
                       description="Run the property suite, then the ONNX export stage, against a target.")
    p.add_argument("--target", metavar="SPEC", default=None,
                   help="package.module:Attr or path/to/file.py:Attr; an nn.Module class built as Attr(d_model, "
                        "n_head) or a factory (d_model, n_head) -> nn.Module (default: the reference)")
    p.add_argument("--adapter", default=None, help="force an adapter instead of finding one by structure: a "
                   "registered name (`mha-verify list` prints them all) or pkg.mod:YourAdapter")
    p.add_argument("--profile", choices=list(PROFILES), default=None,
                   help="Hypothesis profile (default: $MHA_VERIFY_PROFILE or ci)")
    p.add_argument("--max-examples", type=positive_int, default=None, help="examples per property")
    p.add_argument("--seed", type=seed, default=None, help="Hypothesis seed (replaces derandomization)")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated property names; only these run, the ONNX export stage is skipped "
                        "(said on stderr)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="run every property on the target cast to this dtype, with tolerances from the one "
                        "table (gradcheck stays in float64; properties that cannot run in it are n/a with the reason)")
    p.add_argument("--no-export", action="store_true", help="skip the ONNX export stage")
    p.add_argument("--report", metavar="FILE.json", default=None, help="write a JSON report")
    p.add_argument("--junit", metavar="FILE.xml", default=None, help="write JUnit XML (one testcase per check)")
    p.add_argument("--html", metavar="FILE.html", default=None,
                   help="write a self-contained HTML report (error histograms, weight heatmaps)")
    p.add_argument("--database", metavar="DIR|URL", default=None,
                   help="Hypothesis example database: failures found once are replayed first next time, by every "
                        "run that shares it: a folder (local or shared storage) or redis://host:port/db")
    p.add_argument("--baseline", metavar="FILE.json", default=None,
                   help="worst errors per check: stored if FILE does not exist, else held against this run")
    p.add_argument("--budget", type=finite_positive, default=2.0,
                   help="with --baseline: fail when a worst error exceeds BUDGET x its baseline (default 2)")
    p.add_argument("--update-baseline", action="store_true", help="with --baseline: overwrite it with this run")
    p.add_argument("--baseline-despite-failures", action="store_true",
                   help="with --baseline: write it even when a check failed (failed checks keep their old entry)")
    p.add_argument("--bundle-dir", metavar="DIR", default=None,
                   help="write a reproduction bundle of each failure: a standalone replay.py (torch and the "
                   "layer's library only) for a layer's failing check, the ONNX model and inputs for an export's")
    p.add_argument("--timeout", type=positive_int, default=None,
                   help="seconds per check before it counts as hung (default: 60, or 0.6 per example if more)")
    p.add_argument("--no-isolation", action="store_true",
                   help="run checks in this process (faster start; a crash then ends the gate)")
    p.add_argument("--jobs", type=process_count, default=None,
                   help="worker processes running checks side by side (default: one per core)")
    p.add_argument("--shard", type=parse_shard, default=None, metavar="I/N",
                   help="run only the I-th of N parts of the checks (the same split on every machine, balanced by "
                        "their measured cost); `mha-verify merge` combines the parts' --report files")
    p.set_defaults(func=run_check)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mha-verify",
        description="Property-based verification of multi-head attention layers and their ONNX exports. "
                    "Without a subcommand, runs `check` on the reference.",
        epilog="Exit codes: 0 pass, 1 a check failed, 2 usage or input error.",
    )
    parser.add_argument("--version", action="version", version=f"mha-verify {__version__} ({VERSION_RULE})")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="{" + ",".join(SUBCOMMANDS) + "}")
    add_check_parser(sub)
    lp = sub.add_parser("list", help="list the properties, relations and adapters, and what each states")
    lp.set_defaults(func=run_list)
    from mha_verify import export_cmds

    export_cmds.add_parsers(sub)
    from mha_verify import merge_cmd, search_cmd, sweep_cmd

    sweep_cmd.add_parser(sub)
    merge_cmd.add_parser(sub)
    search_cmd.add_parser(sub)
    return parser


def _replay_command(args: argparse.Namespace, name: str) -> str:
    parts = ["mha-verify", "check", "--no-export", "--only", name]
    if args.target:
        parts += ["--target", args.target]
    if args.adapter:
        parts += ["--adapter", args.adapter]
    if args.profile:
        parts += ["--profile", args.profile]
    if args.max_examples:
        parts += ["--max-examples", str(args.max_examples)]
    if args.seed is not None:
        parts += ["--seed", str(args.seed)]
    if args.dtype != "float32":
        parts += ["--dtype", args.dtype]
    if args.database:  # the stored counterexample replays first; a URL's password is not written into reports
        from mha_verify.properties.engine.databases import redact

        parts += ["--database", redact(args.database)]
    return shlex.join(parts)


def run_check(args: argparse.Namespace) -> int:
    if not args.no_isolation:
        from mha_verify.isolation import start_server

        start_server(args.target)
    from mha_verify import baseline, gate_outputs, shards
    from mha_verify.export.atomic import AtomicWriter
    from mha_verify.export.opsets import EXPORTERS
    from mha_verify.isolation import EXPORT_TIMEOUT_FACTOR, Limits, default_jobs, probe_target, run_task_groups
    from mha_verify.properties.engine import databases, profiles
    from mha_verify.properties.invariants.suite import select
    from mha_verify.properties.protocol import TargetError
    from mha_verify.properties.targets.eager import load_target
    from mha_verify.tasks import Task

    try:
        profile = profiles.profile_name(args.profile)
        names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only is not None else None
        if names == []:
            raise ValueError(f"--only names no property: {args.only!r}")
        for flag in ("report", "junit", "html", "baseline", "database", "bundle_dir"):
            if getattr(args, flag) == "":
                raise ValueError(f"--{flag.replace('_', '-')} is an empty path")
        props = select(names)
        spec = load_target(args.target, adapter=args.adapter).spec if args.no_isolation \
            else probe_target(args.target, args.adapter, timeout=args.timeout)
        writers = {kind: AtomicWriter(path) for kind, path in
                   (("report", args.report), ("junit", args.junit), ("html", args.html)) if path}
        stored: dict[str, float] | None = None
        kept: dict[str, float] = {}
        context = {"target": spec, "dtype": args.dtype, "profile": profile}
        if args.baseline:
            if Path(args.baseline).exists() and not args.update_baseline:
                stored = baseline.load(args.baseline, context)
            else:
                kept = baseline.previous(args.baseline) if Path(args.baseline).is_file() else {}
                writers["baseline"] = AtomicWriter(args.baseline)
        if args.database:
            databases.prepare(args.database)
        if args.bundle_dir:
            Path(args.bundle_dir).mkdir(parents=True, exist_ok=True)
        if args.shard is not None and args.baseline:
            raise ValueError(f"--baseline compares a whole run, and --shard {args.shard} runs a part of one: "
                             "run the shards with --report, merge them, then compare")
    except (ValueError, TargetError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(f"mha-verify {__version__}: checking {spec} with profile {profile}", file=sys.stderr)
    common = dict(target_spec=args.target, adapter=args.adapter, profile=profile, max_examples=args.max_examples,
                  database=args.database)
    examples = args.max_examples or profiles.PROFILES[profile].max_examples
    tasks = [Task(p.name, "properties", "property_check", dict(
        common, name=p.name, seed=args.seed, dtype=args.dtype, replay=_replay_command(args, p.name),
        bundle_dir=args.bundle_dir),
        examples=examples) for p in props]
    if not args.no_export and names is None:  # one task per exporter, so that they can run side by side
        tasks += [Task(f"export-{exporter}", "export", "export_checks",
                       dict(common, bundle_dir=args.bundle_dir, exporters=(exporter,)),
                       examples=examples, timeout_factor=EXPORT_TIMEOUT_FACTOR)
                  for exporter in EXPORTERS]
    elif not args.no_export:
        print("mha-verify: --only runs the named properties only: the ONNX export stage is skipped "
              "(run without --only to export)", file=sys.stderr)
    shard_block = None
    if args.shard is not None:
        mine = shards.select([t.name for t in tasks], args.shard)
        if not mine:
            raise UsageError(f"--shard {args.shard}: {args.shard.count} shards for {len(tasks)} checks leaves this "
                             f"one empty; use at most {len(tasks)} shards")
        print(f"mha-verify: shard {args.shard}: {len(mine)} of {len(tasks)} checks "
              f"({', '.join(tasks[i].name for i in mine[:4])}{', ...' if len(mine) > 4 else ''})", file=sys.stderr)
        shard_block = {"index": args.shard.index, "count": args.shard.count, "tasks": [t.name for t in tasks],
                       "options": {"dtype": args.dtype, "max_examples": args.max_examples}}
        tasks = [tasks[i] for i in mine]
    limits = None if args.no_isolation else Limits(timeout=args.timeout)

    started, begun, jobs = [0], time.monotonic(), args.jobs or default_jobs()

    def progress(name: str) -> None:
        started[0] += 1
        # a check starts when a worker is free: those started beyond the workers are the ones done, and
        # the time left is theirs averaged (a rough figure, said to be one)
        done, elapsed = started[0] - min(jobs, len(tasks)), time.monotonic() - begun
        left = f", ~{elapsed / done * (len(tasks) - done):.0f} s left" if done > 0 else ""
        print(f"  [{started[0]}/{len(tasks)}, {elapsed:.0f} s{left}] running {name} ...", file=sys.stderr, flush=True)

    # longest first (the exports, then the properties that sweep the size boundaries), so that no
    # worker is left alone with a long check at the end
    full = {p.name for p in props if p.reach != "modest"}
    groups = run_task_groups(tasks, limits=limits, progress=progress, jobs=jobs,
                             rank=lambda t: 0 if t.stage == "export" else 1 if t.name in full else 2)
    results = [r for group in groups for r in group]
    if shard_block is not None:
        shard_block["mine"] = [[t.name, len(group)] for t, group in zip(tasks, groups, strict=True)]
    if stored is not None:
        results += baseline.compare(results, stored, args.budget)
    gate_outputs.print_results(results)
    documents = gate_outputs.render(results, [k for k in ("report", "junit", "html") if k in writers], target=spec,
                                    profile=profile, seed=args.seed, shard=shard_block)
    if "baseline" in writers:
        failed = [r.name for r in results if r.failed]
        if failed and not args.baseline_despite_failures:
            print(f"mha-verify: baseline {args.baseline!r} not written: {len(failed)} checks failed "
                  f"({', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}); fix them, or pass "
                  "--baseline-despite-failures (failed checks then keep their old entries)", file=sys.stderr)
        else:
            documents["baseline"] = baseline.document(results, context, kept).encode("utf-8")
    unwritten = gate_outputs.write_all(writers, documents)
    if unwritten:
        raise UsageError(f"could not write {', '.join(unwritten)}; the verdicts are printed above")
    return gate_outputs.exit_code(results)


def run_list(args: argparse.Namespace) -> int:
    from mha_verify.properties.adapters.registry import adapters
    from mha_verify.properties.invariants.suite import all_properties, all_relations

    checks = [(p.name, p.doc) for p in all_properties().values()]
    checks += [(r.name, r.doc) for r in all_relations().values()]
    for name, doc in checks:
        print(f"{name}\n    " + doc.replace("\n", "\n    ") + "\n")
    try:
        registered = adapters()
    except ValueError as exc:  # an installed package's broken entry point
        raise UsageError(str(exc)) from None
    print("adapters (--adapter NAME; found by structure in this order):")
    for adapter in registered:
        print(f"    {adapter.name}: {adapter.description}")
    return EXIT_OK


def with_subcommand(argv: list[str]) -> list[str]:
    """The arguments the parser reads: ``mha-verify [check options]`` is ``mha-verify check ...``."""
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        return ["check", *argv]
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = with_subcommand(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    # CI cancels with SIGTERM: unwind, as for Ctrl-C. SIGINT gets Python's own handler even where
    # the parent ignored it (a background job, a test runner's worker): the run must stay stoppable
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler) if main_thread else None
    try:
        code = int(args.func(args))
        if _TERMINATED.is_set():  # the signal's exception was swallowed where it landed (a gc callback)
            print("mha-verify: terminated", file=sys.stderr)
            return EXIT_TERMINATED
        return code
    except UsageError as exc:
        print(printable(f"mha-verify: error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        _stop_workers()
        print(f"mha-verify: {'terminated' if isinstance(exc, Terminated) else 'interrupted'}", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that the run unwinds (temp files, workers) as for Ctrl-C."""


_TERMINATED = threading.Event()


def _terminated(signum: int, frame: object) -> None:
    # the workers end here and now: the exception below may land where Python swallows it
    _TERMINATED.set()
    _stop_workers()
    raise Terminated


def _stop_workers() -> None:
    """End every worker process the run started, and what they started (see isolation.stop_all)."""
    isolation = sys.modules.get("mha_verify.isolation")
    if isolation is not None:
        isolation.stop_all()


if __name__ == "__main__":
    sys.exit(main())
