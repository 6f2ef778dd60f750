"""onnxruntime CPU latency of the exported reference against the torch eager fast path, and
validation throughput. One command, one run, repetitions interleaved (eager, ORT, eager, ...)
so that both see the same machine state; prints medians and ratios.

    python benchmarks/bench_export.py [--exporter dynamo|torchscript] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import onnxruntime as ort
import torch
from hypothesis import settings

from mha_verify.export.onnx_export import export_onnx
from mha_verify.properties.targets.eager import load_target
from mha_verify.validation import validate_model

SIZES = ((1, 16, 512, 8), (8, 128, 512, 8), (4, 512, 512, 8), (1, 2048, 512, 8))  # (B, L, D, H)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads for both torch and onnxruntime (default 1: on a shared 2-core "
                             "machine torch's OpenMP pool degrades 40x under load)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), onnxruntime {ort.__version__}, "
          f"exporter {args.exporter}")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'B':>3} {'L':>5} {'D':>4} {'H':>2}  {'eager ms':>9}  {'ort ms':>9}  {'ort/eager':>9}")
        for B, L, D, H in SIZES:
            bound = load_target().build(D, H, seed=0)
            path = Path(tmp) / f"m{D}_{H}.onnx"
            if not path.exists():
                export_onnx(bound, path, exporter=args.exporter)
            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.intra_op_num_threads = args.threads
            # no spinning: onnxruntime's idle threads would otherwise spin and steal the
            # cores from the interleaved eager runs
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            q, k, v = (torch.randn(B, L, D) for _ in range(3))
            feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(),
                    "mask": torch.ones(1, 1, 1, 1, dtype=torch.bool).numpy()}  # (1, 1, 1, 1) True: no mask
            eager_t, ort_t = [], []
            with torch.inference_mode():
                bound(q, k, v)
                session.run(None, feed)
                for _ in range(args.reps):
                    t = time.perf_counter()
                    bound(q, k, v)
                    eager_t.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    session.run(None, feed)
                    ort_t.append(time.perf_counter() - t)
            e, o = statistics.median(eager_t) * 1e3, statistics.median(ort_t) * 1e3
            print(f"{B:>3} {L:>5} {D:>4} {H:>2}  {e:>9.3f}  {o:>9.3f}  {o / e:>9.2f}")
        bound = load_target().build(16, 4, seed=0)
        path = Path(tmp) / "small.onnx"
        export_onnx(bound, path, exporter=args.exporter)
        start = time.perf_counter()
        results = validate_model(path, eager=bound,
                                 settings=settings(max_examples=100, derandomize=True, deadline=None))
        seconds = time.perf_counter() - start
        n = sum(r.examples for r in results)
        failed = sum(r.failed for r in results)
        print(f"validation: {n} examples in {seconds:.1f} s = {n / seconds:.0f} examples/s "
              f"({len(results)} checks, {failed} failed; cpu, opt-none + opt-all)")


if __name__ == "__main__":
    main()
