"""What the gate costs, against the work it cannot skip.

    python -m benchmarks.bench_gate [--profiles quick,ci] [--pytest]

Prints: the floor (starting Python and importing torch, onnxruntime and the harness; one
export with each exporter), the gate's wall time per profile (with its default workers, one
per core) and its ratio to that floor,
examples per second per property (from the gate's JSON report), and with ``--pytest`` the
speed-up of ``pytest -n 2`` over a serial run of the test suite. Every figure comes from
this one run; nothing is timed inside the tests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EXPORT_ONCE = """
import sys, tempfile, time, warnings
warnings.filterwarnings("ignore")
from pathlib import Path
from mha_verify.export.onnx_export import export_onnx
from mha_verify.properties.targets.eager import load_target
bound = load_target().build(16, 4)
start = time.perf_counter()
export_onnx(bound, Path(tempfile.mkdtemp()) / "m.onnx", exporter=sys.argv[1])
print(time.perf_counter() - start)
"""


def _wall(cmd: list[str], **kw: object) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    return time.perf_counter() - start, proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", default="quick,ci", help="comma-separated gate profiles to time")
    parser.add_argument("--pytest", action="store_true", help="also time the test suite, serial and -n 2")
    args = parser.parse_args(argv)

    imports, _ = _wall([sys.executable, "-c", "import torch, onnxruntime, onnx, hypothesis, mha, properties, export"])
    exports = {}
    for exporter in ("dynamo", "torchscript"):
        wall, proc = _wall([sys.executable, "-c", EXPORT_ONCE, exporter])
        exports[exporter] = float(proc.stdout.strip().splitlines()[-1])
    floor = imports + sum(exports.values())
    print(f"start + imports {imports:.1f} s; export dynamo {exports['dynamo']:.1f} s, "
          f"torchscript {exports['torchscript']:.2f} s; floor {floor:.1f} s")

    for profile in args.profiles.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "r.json"
            wall, proc = _wall([sys.executable, "-m", "mha_verify.cli", "--profile", profile, "--report", str(report)])
            if proc.returncode != 0:
                print(f"gate --profile {profile} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
                return 1
            doc = json.loads(report.read_text())
        from mha_verify.isolation import default_jobs

        busy = sum(r["seconds"] for r in doc["results"])
        print(f"\ngate --profile {profile}: {wall:.1f} s wall = {wall / floor:.1f} x the floor "
              f"({default_jobs()} workers; the checks' own times add up to {busy:.1f} s)")
        props = [r for r in doc["results"] if r["stage"] == "properties"]
        for r in props:
            rate = r["examples"] / r["seconds"] if r["seconds"] else float("nan")
            print(f"  {r['name']:<22} {r['examples']:>5} examples  {r['seconds']:>6.2f} s  {rate:>7.0f} examples/s")
        export = [r for r in doc["results"] if r["stage"] == "export"]
        for name in ("dynamo", "torchscript"):
            rows = [r for r in export if r["name"].startswith(name)]
            n = sum(r["examples"] for r in rows)
            s = sum(r["seconds"] for r in rows if not r["name"].endswith("/export"))
            exp = sum(r["seconds"] for r in rows if r["name"].endswith("/export"))
            print(f"  export {name:<12} export {exp:.1f} s, validation {n} examples in {s:.1f} s "
                  f"= {n / s if s else float('nan'):.0f} examples/s")

    if args.pytest:
        serial, p1 = _wall([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        parallel, p2 = _wall([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider"])
        tail = (p1.stdout.strip().splitlines() or [""])[-1], (p2.stdout.strip().splitlines() or [""])[-1]
        print(f"\npytest serial {serial:.0f} s ({tail[0]}); -n 2 {parallel:.0f} s ({tail[1]}); "
              f"speed-up {serial / parallel:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
