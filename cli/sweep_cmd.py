"""``mha-verify sweep``: its arguments and what it prints (the work is :mod:`mha_verify.sweep`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from mha_verify.arg_types import positive_int, positive_seconds, process_count, seed
from mha_verify.exit_codes import EXIT_FAIL, EXIT_OK, usage_error
from mha_verify.shards import parse_shard
from mha_verify.sweep_rows import Row


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from mha_verify.properties.engine.profiles import PROFILES

    sp = subparsers.add_parser(
        "sweep", help="build every attention class of a library with no user code and run the gate on each",
        description="Find every class named *Attention in an installed library (its files are read, not imported), "
                    "build each with no user code, run the gate on each (--no-export), and write a truth table: "
                    "OUT/sweep.md and OUT/sweep.json, rewritten after every class; run again into the same OUT to "
                    "resume. Exit 0 every verified class passed, 1 a class failed, hung or crashed, or none was "
                    "verified, 2 usage error.")
    sp.add_argument("library", help="an installed package: transformers, diffusers, or any other")
    sp.add_argument("--out", required=True, help="folder for sweep.md, sweep.json and the per-class reports")
    sp.add_argument("--profile", choices=sorted(PROFILES), default="quick", help="Hypothesis profile (default quick)")
    sp.add_argument("--max-examples", type=positive_int, default=None,
                    help="examples per property (default: the profile's)")
    sp.add_argument("--build-only", action="store_true", help="import, build and call each class once; no checks")
    sp.add_argument("--match", default=None, metavar="REGEX", help="only classes whose package.module:Class matches")
    sp.add_argument("--sample", type=positive_int, default=None, metavar="N",
                    help="a seeded random sample of N of the (matching) classes")
    sp.add_argument("--seed", type=seed, default=0, help="the sample's seed (default 0)")
    sp.add_argument("--jobs", type=process_count, default=1, help="classes checked side by side (default 1)")
    sp.add_argument("--build-timeout", type=positive_seconds, default=120.0,
                    help="seconds to import, build and call one class (default 120)")
    sp.add_argument("--class-timeout", type=positive_seconds, default=900.0,
                    help="seconds for the gate on one class (default 900)")
    sp.add_argument("--fresh", action="store_true", help="judge every class again instead of resuming")
    sp.add_argument("--retry", action="store_true",
                    help="resume, judging again every class that failed, timed out, crashed or hung")
    sp.add_argument("--shard", type=parse_shard, default=None, metavar="I/N",
                    help="judge only the I-th of N parts of the classes (every N-th, the same on every machine); "
                         "`mha-verify merge --out DIR PART/sweep.json ...` makes the one table")
    sp.add_argument("--costs", metavar="SWEEP.json", default=None,
                    help="with --shard: balance the shards by each class's seconds in an earlier sweep.json "
                         "(the same file on every machine); without it, every N-th class")
    sp.set_defaults(func=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    """Catches its own usage errors (as ``export_cmds``: ``cli.UsageError`` is another class when
    the CLI runs as ``python -m mha_verify.cli``)."""
    from mha_verify.sweep import Options, sweep

    if not args.out:
        return usage_error("--out is an empty path")
    if args.costs is not None and args.shard is None:
        return usage_error("--costs balances shards: give it with --shard I/N")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return usage_error(f"--out {args.out!r} exists and is not a folder")
    opts = Options(args.library, out, profile=args.profile, max_examples=args.max_examples,
                   build_only=args.build_only, match=args.match,
                   sample=args.sample, seed=args.seed, jobs=args.jobs, build_timeout=args.build_timeout,
                   class_timeout=args.class_timeout, fresh=args.fresh, retry=args.retry, shard=args.shard,
                   costs=Path(args.costs) if args.costs else None)
    command = "mha-verify " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "mha-verify sweep"

    def progress(row: Row) -> None:
        print(f"{row.status:>20}  {row.spec}", file=sys.stderr, flush=True)

    try:
        rows = sweep(opts, command=command, progress=progress)
    except (ValueError, OSError) as exc:
        return usage_error(str(exc))
    return report(rows, out, build_only=args.build_only)


def report(rows: list[Row], out: Path, *, build_only: bool) -> int:
    """Print the totals and where the table is; the exit code (also ``merge``'s for sweeps)."""
    from mha_verify.sweep_rows import totals

    total = totals(rows)
    print(", ".join(f"{k} {v}" for k, v in total.items()))
    print(f"table: {out / 'sweep.md'}")
    bad = total["failed"] + sum(total.get(s, 0) for s in ("check timed out", "check crashed", "nothing verified",
                                                           "hung while built", "crashed while built",
                                                           "check raised in mha-verify"))
    if build_only:
        return EXIT_OK if total["built"] else EXIT_FAIL
    return EXIT_FAIL if bad or not total["verified"] else EXIT_OK
