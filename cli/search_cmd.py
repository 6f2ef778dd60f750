"""``mha-verify search``: the continuous search's command line (see :mod:`mha_verify.search`)."""

from __future__ import annotations

import argparse
import secrets
import sys

from mha_verify.arg_types import positive_int, positive_seconds, process_count, seed
from mha_verify.escape import printable
from mha_verify.exit_codes import usage_error


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    sp = subparsers.add_parser(
        "search", help="search the properties for hours on a Dask cluster, feeding a shared example database",
        description="Run rounds of random examples of every property against a target on a Dask cluster (this "
                    "machine's cores, or --scheduler tcp://HOST:8786 for many machines) until --seconds have passed. "
                    "Each failure found is shrunk and saved in --database, where every later `check` with that "
                    "database replays it first. Exit 0 nothing found, 1 a property failed (or nothing was compared), "
                    "2 usage error. Needs `pip install 'mha-verify[search]'`.")
    sp.add_argument("--target", metavar="SPEC", default=None, help="as for check (default: the reference)")
    sp.add_argument("--adapter", default=None, help="as for check")
    sp.add_argument("--database", metavar="DIR|URL", required=True,
                    help="the example database every worker feeds: a (shared) folder or redis://host:port/db")
    sp.add_argument("--seconds", type=positive_seconds, required=True, help="how long to search")
    sp.add_argument("--workers", type=process_count, default=None,
                    help="worker processes of the local cluster, at most one per core this process may use "
                         "(default: one per core); more machines join through --scheduler")
    sp.add_argument("--scheduler", metavar="ADDRESS", default=None,
                    help="a running Dask scheduler (tcp://HOST:8786) whose workers do the rounds, on any machines; "
                         "one that does not answer within seconds is a usage error")
    sp.add_argument("--only", default=None, metavar="NAMES", help="comma-separated properties to search")
    sp.add_argument("--examples", type=positive_int, default=200, help="random examples per round (default 200)")
    sp.add_argument("--seed", type=seed, default=None, help="seed of the rounds (default: a random one, printed)")
    sp.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    sp.add_argument("--report", metavar="FILE.json", default=None, help="write a JSON report")
    sp.add_argument("--junit", metavar="FILE.xml", default=None, help="write JUnit XML")
    sp.add_argument("--html", metavar="FILE.html", default=None, help="write an HTML report")
    sp.set_defaults(func=run_search)


def run_search(args: argparse.Namespace) -> int:
    from mha_verify import gate_outputs
    from mha_verify.export.atomic import AtomicWriter
    from mha_verify.isolation import default_jobs, probe_target
    from mha_verify.properties.engine import databases
    from mha_verify.properties.invariants.suite import select
    from mha_verify.properties.protocol import TargetError
    from mha_verify.search import SearchOptions, search

    if args.workers is not None and args.scheduler is not None:
        return usage_error("--workers sizes the local cluster and --scheduler names another one: give one of them")
    try:
        names = [n.strip() for n in args.only.split(",") if n.strip()] if args.only is not None else None
        if names == []:
            raise ValueError(f"--only names no property: {args.only!r}")
        props = select(names)
        for flag in ("report", "junit", "html"):
            if getattr(args, flag) == "":
                raise ValueError(f"--{flag} is an empty path")
        databases.prepare(args.database)
        spec = probe_target(args.target, args.adapter)
        writers = {kind: AtomicWriter(path) for kind, path in
                   (("report", args.report), ("junit", args.junit), ("html", args.html)) if path}
    except (ValueError, TargetError, OSError) as exc:
        return usage_error(str(exc))
    chosen_seed = args.seed if args.seed is not None else secrets.randbelow(2**32)
    opts = SearchOptions(args.target, args.adapter, args.database, args.seconds, tuple(p.name for p in props),
                         workers=args.workers or default_jobs(), scheduler=args.scheduler, examples=args.examples,
                         seed=chosen_seed, dtype=args.dtype)
    where = args.scheduler or f"a local Dask cluster of {opts.workers} workers"
    banner = (f"mha-verify: searching {spec} for {args.seconds:g} s on {where}, seed {chosen_seed}, "
              f"{len(props)} properties, {args.examples} examples a round, database {databases.redact(args.database)}")

    def say(line: str) -> None:
        print(printable(line), file=sys.stderr, flush=True)

    try:  # the banner once the cluster answers: a scheduler that does not is the one line of a usage error
        results = search(opts, log=say, ready=lambda: say(banner))
    except ValueError as exc:
        return usage_error(str(exc))
    gate_outputs.print_results(results)
    documents = gate_outputs.render(results, list(writers), target=spec, profile=f"search {args.examples}/round",
                                    seed=chosen_seed)
    unwritten = gate_outputs.write_all(writers, documents)
    if unwritten:
        return usage_error(f"could not write {', '.join(unwritten)}; the verdicts are printed above")
    return gate_outputs.exit_code(results)
