"""The gate's wall time against workers and shards, measured side by side in one run.

    python -m benchmarks.bench_shards [--target SPEC] [--profile ci] [--shards 2,3]
    python -m benchmarks.bench_shards --sweep LIBRARY --match REGEX [--shards 2]

Runs, one after another (never two configurations at once):

- one process, ``--jobs 1``; one process, ``--jobs 2`` (this machine's cores);
- N shards (``--shard I/N --jobs 1``) started together as N processes, standing in for N
  machines (each gets its share of the cores: OMP_NUM_THREADS = cores // N), then
  ``mha-verify merge`` of their reports (checked to give the single run's verdicts).

and prints each wall time and its ratio to ``--jobs 1``. With ``--sweep`` the same for
``mha-verify sweep LIBRARY --match REGEX`` (its classes judged one at a time, two at a time, and
as N shards merged into one table, checked to give the same status per class). Then the model of N real machines,
from this run's own figures: a machine's wall time is its fixed start (the process, imports, the
target's probe: measured as the ``--jobs 1`` wall less its checks' seconds) plus the seconds of
the checks its shard holds (the split ``--shard`` makes, priced at this run's measured seconds
per check). It stops falling when one check (the dynamo export) is a shard of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mha_verify.shards import Shard, select

ROOT = Path(__file__).resolve().parent.parent


def _task(result: dict[str, object]) -> str:
    """The gate task a result belongs to: a property, or one exporter's export and validation."""
    name = str(result["name"])
    return name if result["stage"] != "export" else "export-" + name.split("-")[0]


def _gate(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "mha_verify.cli", "check", *args]


def _run_together(cmds: list[list[str]], threads: int | None = None) -> tuple[float, list[int]]:
    """Wall time of ``cmds`` started together; ``threads``: torch's threads in each (OMP_NUM_THREADS),
    so that N processes standing in for N machines share the cores instead of each taking all."""
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    start = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for c in cmds]
    codes = [p.wait() for p in procs]
    return time.perf_counter() - start, codes


def _sweep(library: str, match: str, shard_counts: list[int]) -> int:
    cores = len(os.sched_getaffinity(0))
    rows: list[tuple[str, float]] = []

    def sweep(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "mha_verify.cli", "sweep", library, "--match", match, "--out", str(out), *extra]

    def statuses(folder: Path) -> list[tuple[str, str]]:
        return [(r["spec"], r["status"]) for r in json.loads((folder / "sweep.json").read_text())["rows"]]

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        wall1, _ = _run_together([sweep(base / "j1", "--jobs", "1")])
        rows.append(("1 process, --jobs 1", wall1))
        one = statuses(base / "j1")
        wall2, _ = _run_together([sweep(base / "j2", "--jobs", "2")])
        rows.append((f"1 process, --jobs 2 (same statuses: {statuses(base / 'j2') == one})", wall2))
        for n in shard_counts:
            wall, _ = _run_together([sweep(base / f"s{n}-{i}", "--jobs", "1", "--shard", f"{i}/{n}")
                                     for i in range(1, n + 1)], threads=max(1, cores // n))
            subprocess.run([sys.executable, "-m", "mha_verify.cli", "merge", "--out", str(base / f"m{n}"),
                            *(str(base / f"s{n}-{i}" / "sweep.json") for i in range(1, n + 1))],
                           cwd=ROOT, capture_output=True, text=True)
            same = (base / f"m{n}" / "sweep.json").exists() and statuses(base / f"m{n}") == one
            rows.append((f"{n} shards as {n} processes, {max(1, cores // n)} thread(s) each (merged: "
                         f"{'same statuses' if same else 'DIFFERENT'})", wall))
    print(f"sweep {library} --match {match!r}: {len(one)} classes, {cores} cores, one configuration at a time")
    for label, wall in rows:
        print(f"  {label:72s} {wall:7.1f} s   {wall1 / wall:5.2f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="the target (default: the reference)")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--shards", default="2,3", help="shard counts to run as processes side by side")
    parser.add_argument("--sweep", metavar="LIBRARY", default=None, help="time `mha-verify sweep LIBRARY` instead")
    parser.add_argument("--match", default=None, help="with --sweep: the classes to sweep (a regular expression)")
    args = parser.parse_args(argv)
    if args.sweep:
        return _sweep(args.sweep, args.match or ".", [int(x) for x in args.shards.split(",")])
    base = ["--profile", args.profile] + (["--target", args.target] if args.target else [])
    rows: list[tuple[str, float]] = []
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        single = Path(tmp) / "single.json"
        wall1, _ = _run_together([_gate([*base, "--jobs", "1", "--report", str(single)])])
        rows.append(("1 process, --jobs 1", wall1))
        doc = json.loads(single.read_text())
        seconds: dict[str, float] = {}
        for r in doc["results"]:
            seconds[_task(r)] = seconds.get(_task(r), 0.0) + float(r["seconds"])
        wall2, _ = _run_together([_gate([*base, "--jobs", "2"])])
        rows.append(("1 process, --jobs 2", wall2))
        for n in (int(x) for x in args.shards.split(",")):
            parts = [str(Path(tmp) / f"p{n}-{i}.json") for i in range(1, n + 1)]
            wall, _ = _run_together([_gate([*base, "--jobs", "1", "--shard", f"{i}/{n}", "--report", parts[i - 1]])
                                         for i in range(1, n + 1)], threads=max(1, cores // n))
            merged = Path(tmp) / f"m{n}.json"
            proc = subprocess.run([sys.executable, "-m", "mha_verify.cli", "merge", *parts, "--report", str(merged)],
                                  cwd=ROOT, capture_output=True, text=True)
            same = [(r["name"], r["verdict"]) for r in json.loads(merged.read_text())["results"]] == \
                [(r["name"], r["verdict"]) for r in doc["results"]] if proc.returncode in (0, 1) else False
            rows.append((f"{n} shards as {n} processes, {max(1, cores // n)} thread(s) each "
                         f"(merged: {'same verdicts' if same else 'DIFFERENT'})", wall))
    print(f"gate on {args.target or 'the reference'}, profile {args.profile}, {cores} cores, "
          "one configuration at a time")
    for label, wall in rows:
        print(f"  {label:72s} {wall:7.1f} s   {wall1 / wall:5.2f}x")
    checks = sum(seconds.values())
    start = max(0.0, wall1 - checks)
    names = list(seconds)
    print(f"\nmodel of N machines: start {start:.1f} s + the largest shard's checks "
          f"(checks {checks:.1f} s in all; longest {max(seconds, key=seconds.__getitem__)} "
          f"{max(seconds.values()):.1f} s)")
    for n in range(1, 9):
        loads = [sum(seconds[names[i]] for i in select(names, Shard(s, n)))
                 for s in range(1, min(n, len(names)) + 1)]
        print(f"  N={n}: {start + max(loads):6.1f} s   {wall1 / (start + max(loads)):5.2f}x   "
              f"(shards {', '.join(f'{x:.0f}' for x in loads)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
