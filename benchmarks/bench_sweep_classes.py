"""What one class of a sweep costs, today's code against an earlier one, measured side by side.

    python -m benchmarks.bench_sweep_classes --before DIR [--after DIR] --table SWEEP_JSON [--sample 12] [--seed 0]
    python -m benchmarks.bench_sweep_classes --sweep --before DIR ... [--also CLASS,CLASS] [--jobs 2]

``DIR`` holds an earlier ``mha_verify`` package (a snapshot of the installed one, e.g. the
editable build's ``mha_verify`` folder copied at that commit); ``SWEEP_JSON`` is a
``mha-verify sweep LIBRARY --build-only`` table, whose built classes are sampled (seeded). For
each class, in a shuffled order per class, both versions run the sweep's own command
(``mha-verify check --target C --profile quick --no-export --jobs 1``) with the same Hypothesis
``--seed``, so that they draw the same examples: the benchmark prints each one's wall time and
whether their verdicts agree property by property. Two checks never run at once.

With ``--sweep``, each version runs the sweep itself on the sample (``mha-verify sweep LIBRARY
--match '^(...)$' --jobs N --fresh``, the versions in a shuffled order, one after the other):
its wall time, the ratio, and whether every class got the same status and verdict counts.
``--also`` adds classes (by name) to the sample, e.g. the failing ones, whose cost is shrinking.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(pythonpath: str | None, spec: str, seed: int, report: Path) -> tuple[float, dict[str, str]]:
    env = _env(pythonpath)
    cmd = [sys.executable, "-m", "mha_verify.cli", "check", "--target", spec, "--profile", "quick", "--jobs", "1",
           "--no-export", "--seed", str(seed), "--report", str(report)]
    start = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    seconds = time.perf_counter() - start
    if not report.is_file():
        return seconds, {}
    doc = json.loads(report.read_text())
    return seconds, {str(r["name"]): f"{r['verdict']}/{r.get('kind') or ''}" for r in doc.get("results", [])}


def _env(pythonpath: str | None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def _sweep(pythonpath: str | None, library: str, specs: list[str], jobs: int, out: Path) -> tuple[float, dict]:
    match = "^(" + "|".join(re.escape(s) for s in specs) + ")$"
    cmd = [sys.executable, "-m", "mha_verify.cli", "sweep", library, "--out", str(out), "--fresh", "--match", match,
           "--jobs", str(jobs)]
    start = time.perf_counter()
    subprocess.run(cmd, env=_env(pythonpath), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=7200)
    seconds = time.perf_counter() - start
    doc = json.loads((out / "sweep.json").read_text())
    return seconds, {r["spec"]: (r["status"], r.get("counts"), r.get("check_seconds")) for r in doc["rows"]}


def sweep_main(args: argparse.Namespace, chosen: list[str], versions: dict[str, str | None],
               rng: random.Random) -> int:
    library = chosen[0].partition(".")[0]
    order = list(versions)
    rng.shuffle(order)
    got: dict[str, tuple[float, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in order:
            got[name] = _sweep(versions[name], library, chosen, args.jobs, Path(tmp) / name)
            print(f"{name}: {got[name][0]:.1f} s", flush=True)
    (tb, rb), (ta, ra) = got["before"], got["after"]
    print(f"\n{len(chosen)} classes, --jobs {args.jobs}, run in the order {', '.join(order)}")
    print("| class | before: status, s | after: status, s | same verdicts |\n|---|---|---|---|")
    differ = 0
    for spec in chosen:
        b, a = rb.get(spec, ("missing", None, None)), ra.get(spec, ("missing", None, None))
        same = b[:2] == a[:2] and b[0] != "missing"
        differ += not same
        print(f"| {spec.rpartition(':')[2]} | {b[0]}, {b[2]} | {a[0]}, {a[2]} | {'yes' if same else 'NO'} |")
    print(f"\nsweep wall time: before {tb:.1f} s, after {ta:.1f} s, after / before {ta / tb:.3f}; "
          f"classes whose status or verdict counts differ: {differ}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, type=Path, help="folder holding the earlier mha_verify package")
    p.add_argument("--after", type=Path, default=None,
                   help="folder holding the newer package (default: the installed one)")
    p.add_argument("--table", required=True, type=Path, help="a build-only sweep.json of the library")
    p.add_argument("--sample", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="time the sweep of the sample, not each class's check")
    p.add_argument("--jobs", type=int, default=2, help="the sweep's --jobs (with --sweep)")
    p.add_argument("--also", default="", help="class names added to the sample, comma-separated")
    args = p.parse_args(argv)
    for flag, folder in (("--before", args.before), ("--after", args.after)):
        if folder is not None and not (folder / "mha_verify" / "__init__.py").is_file():
            p.error(f"{flag} {str(folder)!r} holds no mha_verify package")
    rows = json.loads(args.table.read_text())["rows"]
    built = [r["spec"] for r in rows if r.get("status") == "built"]
    if not built:
        p.error(f"--table {str(args.table)!r} has no built class")
    rng = random.Random(args.seed)
    chosen = sorted(rng.sample(built, min(args.sample, len(built))))
    extra = {n.strip() for n in args.also.split(",") if n.strip()}
    chosen += [s for s in built if s.rpartition(":")[2] in extra and s not in chosen]
    versions = {"before": str(args.before), "after": None if args.after is None else str(args.after)}
    if args.sweep:
        return sweep_main(args, chosen, versions, rng)
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    differ = 0
    print(f"{len(chosen)} of {len(built)} built classes; seconds of wall time per class")
    print("| class | before | after | after / before | same verdicts |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in chosen:
            order = list(versions)
            rng.shuffle(order)
            got: dict[str, tuple[float, dict[str, str]]] = {}
            for name in order:
                got[name] = _run(versions[name], spec, args.seed, Path(tmp) / f"{name}.json")
            (b, vb), (a, va) = got["before"], got["after"]
            same = vb == va and bool(vb)
            differ += not same
            seconds["before"].append(b)
            seconds["after"].append(a)
            changed = sorted(k for k in set(vb) | set(va) if vb.get(k) != va.get(k))
            print(f"| {spec.rpartition(':')[2]} | {b:.1f} | {a:.1f} | {a / b:.2f} | "
                  f"{'yes' if same else f'NO: {changed}'} |", flush=True)
    tb, ta = sum(seconds["before"]), sum(seconds["after"])
    ratios = [a / b for a, b in zip(seconds["after"], seconds["before"], strict=True)]
    print(f"\ntotal: before {tb:.1f} s, after {ta:.1f} s, after / before {ta / tb:.3f}; "
          f"median ratio {statistics.median(ratios):.3f}; classes whose verdicts differ: {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
