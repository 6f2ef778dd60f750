"""Forward latency of the reference against the alternatives, measured side by side.

    python -m benchmarks.bench_mha [--reps N] [--sizes 1,16,512,8 ...] [--no-onnx]
    python -m benchmarks.bench_mha --ort [--reps N] [--sizes ...]    # the ort/eager table only

Contenders, interleaved in a shuffled order on every repetition so that a noisy machine
affects all alike: the reference's fast path; a hand-written block of four nn.Linear plus
F.scaled_dot_product_attention (no checks); torch.nn.MultiheadAttention; the reference's
math path (need_weights=True, the seed's formula); and the exported model in onnxruntime.
Prints medians and ratios to the hand-written block, the reference's FLOP rate against
this machine's own matmul rate measured in the same run, and the peak memory of a
long-context forward (in a child process).

``--ort``: onnxruntime against eager, self-attention, with and without a mask (a (B, 1, L, L)
bool padding-style mask with ~10% of keys removed), interleaved, 2 threads each (torch's intra-op
threads and onnxruntime's, no spinning). Graphs: the dynamo export at the newest opset (the
standard ``Attention`` operator) with a mask input and mask-free (``--no-mask-input``), and
the ``ort-contrib`` graph (``com.microsoft.MultiHeadAttention``) likewise; "no mask" is timed
on the mask-free graph and on the mask graph fed a (1, 1, 1, 1) True mask (what a deployment
with one graph pays).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mha_verify.mha import MultiHeadAttention

SIZES = [(1, 16, 512, 8), (8, 128, 512, 8), (4, 512, 512, 8), (1, 2048, 512, 8)]


class HandWritten(nn.Module):
    """Four nn.Linear and SDPA, no validation: the floor the reference's fast path is held to."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, Lq, D = q.shape
        Lk = k.shape[1]
        qh = self.q(q).view(B, Lq, self.h, D // self.h).transpose(1, 2)
        kh = self.k(k).view(B, Lk, self.h, D // self.h).transpose(1, 2)
        vh = self.v(v).view(B, Lk, self.h, D // self.h).transpose(1, 2)
        return self.o(F.scaled_dot_product_attention(qh, kh, vh).transpose(1, 2).reshape(B, Lq, D))


def flops(B: int, Lq: int, Lk: int, D: int) -> float:
    """Multiply-adds x 2: four projections and the two attention matmuls."""
    return 2.0 * B * (2 * Lq + 2 * Lk) * D * D + 4.0 * B * Lq * Lk * D


def _time(fn: Callable[[], object], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def _inner(fn: Callable[[], object]) -> int:
    """Calls per timing so that one timing lasts about 20 ms."""
    t = _time(fn, 1)
    return max(1, min(200, int(0.02 / max(t, 1e-7))))


_EXPORTED: dict[tuple[int, int, str, bool], object] = {}


def _session(ref: MultiHeadAttention, graph: str, mask_input: bool) -> object:
    """The reference as ONNX (``graph`` "torch": dynamo at the newest opset; or "ort-contrib"),
    in onnxruntime's CPU provider with as many intra-op threads as torch, no spinning."""
    import tempfile

    import onnxruntime as ort

    from mha_verify.export.onnx_export import as_bound, export_onnx

    key = (ref.d_model, ref.n_head, graph, mask_input)
    if key not in _EXPORTED:
        path = Path(tempfile.mkdtemp()) / "ref.onnx"
        export_onnx(as_bound(ref), path, exporter="dynamo", graph=graph, mask_input=mask_input)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = torch.get_num_threads()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # leave the cores to the others
        _EXPORTED[key] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return _EXPORTED[key]


def _onnx_runner(ref: MultiHeadAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 graph: str = "torch", mask: torch.Tensor | None = None, mask_input: bool = False,
                 ) -> Callable[[], object]:
    """One onnxruntime call on (q, k, v[, mask]); a mask graph without ``mask`` is fed (1, 1, 1, 1) True."""
    session = _session(ref, graph, mask_input)
    feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()}
    if mask_input:
        feed["mask"] = (torch.ones(1, 1, 1, 1, dtype=torch.bool) if mask is None else mask).numpy()
    return lambda: session.run(None, feed)  # type: ignore[attr-defined]


def bench_ort(B: int, L: int, D: int, H: int, *, reps: int) -> dict[str, float]:
    """Medians of eager and onnxruntime contenders at (B, L, D, H), self-attention, interleaved."""
    torch.manual_seed(0)
    x = torch.randn(B, L, D)
    mask = torch.rand(B, 1, L, L) < 0.9  # (B, 1, Lq, Lk) bool keep-mask
    mask[..., 0] = True
    ref = MultiHeadAttention(D, H, dropout=0.0).eval()
    contenders: dict[str, Callable[[], object]] = {
        "eager": lambda: ref(x, x, x), "eager+mask": lambda: ref(x, x, x, mask)}
    for graph in ("torch", "ort-contrib"):
        contenders[f"{graph} mask-free"] = _onnx_runner(ref, x, x, x, graph=graph)
        contenders[f"{graph} all-True"] = _onnx_runner(ref, x, x, x, graph=graph, mask_input=True)
        contenders[f"{graph}+mask"] = _onnx_runner(ref, x, x, x, graph=graph, mask=mask, mask_input=True)
    return _interleaved(contenders, reps)


def _interleaved(contenders: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds per call of each contender, timed ``reps`` times in a shuffled order each repetition."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    with torch.inference_mode():
        inner = {name: _inner(fn) for name, fn in contenders.items()}  # also the warm-up
        for _ in range(reps):
            order = list(contenders)
            random.shuffle(order)
            for name in order:
                samples[name].append(_time(contenders[name], inner[name]))
    return {name: statistics.median(s) for name, s in samples.items()}


def ort_table(sizes: Sequence[tuple[int, ...]], reps: int) -> None:
    """Print ort/eager per size: each graph, no mask (mask-free graph; mask graph fed all-True) and mask."""
    print(f"ort/eager, self-attention, {torch.get_num_threads()} threads each, interleaved; "
          "eager ms (no mask / mask), then ratios")
    cols = ["torch mask-free", "torch all-True", "torch+mask", "ort-contrib mask-free", "ort-contrib all-True",
            "ort-contrib+mask"]
    print(f"{'B, L':>9}  {'eager ms':>17}  " + "  ".join(f"{c:>20}" for c in cols))
    for B, L, D, H in sizes:
        med = bench_ort(B, L, D, H, reps=reps)
        ratios = [med[c] / med["eager+mask" if c.endswith("+mask") else "eager"] for c in cols]
        print(f"{f'{B}, {L}':>9}  {med['eager'] * 1e3:>7.2f} / {med['eager+mask'] * 1e3:>7.2f}  "
              + "  ".join(f"{r:>20.2f}" for r in ratios), flush=True)


def bench_size(B: int, L: int, D: int, H: int, *, cross: bool, reps: int, onnx: bool) -> dict[str, float]:
    Lk = max(1, L // 2) if cross else L
    torch.manual_seed(0)
    q = torch.randn(B, L, D)
    kv = torch.randn(B, Lk, D) if cross else q
    v = torch.randn(B, Lk, D) if cross else q
    ref = MultiHeadAttention(D, H, dropout=0.0).eval()
    hand = HandWritten(D, H).eval()
    tmha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    contenders: dict[str, Callable[[], object]] = {
        "reference": lambda: ref(q, kv, v),
        "hand-written": lambda: hand(q, kv, v),
        "torch MHA": lambda: tmha(q, kv, v, need_weights=False),
        "math path": lambda: ref(q, kv, v, need_weights=True),
    }
    if onnx:
        contenders["onnxruntime"] = _onnx_runner(ref, q, kv, v)
    return _interleaved(contenders, reps)


def matmul_rate(reps: int) -> float:
    """This machine's float32 matmul rate (FLOP/s), median of ``reps`` 1024x1024x1024 products."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    torch.mm(a, b)
    times = [_time(lambda: torch.mm(a, b), 5) for _ in range(reps)]
    return 2 * 1024**3 / statistics.median(times)


LONG_CONTEXT = """
import torch
from mha_verify.mha import MultiHeadAttention

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 2**20  # kB -> GiB

torch.manual_seed(0)
m = MultiHeadAttention(512, 8, dropout=0.0).eval()
x = torch.randn(1, {L}, 512)
with torch.inference_mode():
    m(x[:, :64], x[:, :64], x[:, :64])
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
    before = status("VmHWM:")
    out = m(x, x, x)
    after = status("VmHWM:")
print(before, after, tuple(out.shape))
"""


def long_context_peak(L: int = 16384) -> tuple[float, float]:
    """(RSS before, peak RSS during) a forward at (1, L, 512, 8), in GiB, in a child process."""
    proc = subprocess.run([sys.executable, "-c", LONG_CONTEXT.format(L=L)], capture_output=True, text=True,
                          check=True)
    before, after, _ = proc.stdout.split(maxsplit=2)
    return float(before), float(after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--sizes", nargs="*", default=None, help="B,L,D,H tuples")
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument("--no-long-context", action="store_true")
    parser.add_argument("--ort", action="store_true", help="only the onnxruntime/eager table")
    parser.add_argument("--threads", type=int, default=None, help="torch and onnxruntime intra-op threads")
    args = parser.parse_args(argv)
    sizes = [tuple(int(x) for x in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.ort:
        ort_table(sizes, args.reps)
        return 0
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.reps} interleaved reps")
    rate = matmul_rate(args.reps)
    print(f"matmul rate (1024^3 float32, this run): {rate / 1e9:.1f} GFLOP/s\n")
    header = f"{'B,L,D,H':>14} {'mode':>5}  {'contender':<12} {'median':>10}  {'vs hand':>7}  {'vs MHA':>7}"
    print(header)
    for B, L, D, H in sizes:
        for cross in (False, True):
            med = bench_size(B, L, D, H, cross=cross, reps=args.reps, onnx=not args.no_onnx)
            for name, t in med.items():
                print(f"{f'{B},{L},{D},{H}':>14} {'cross' if cross else 'self':>5}  {name:<12} {t * 1e3:>8.3f}ms  "
                      f"{t / med['hand-written']:>7.3f}  {t / med['torch MHA']:>7.3f}")
            Lk = max(1, L // 2) if cross else L
            frac = flops(B, L, Lk, D) / med["reference"] / rate
            print(f"{'':>14} {'':>5}  reference FLOP rate {flops(B, L, Lk, D) / med['reference'] / 1e9:.1f} GFLOP/s"
                  f" = {frac:.2f} of matmul")
    if not args.no_long_context:
        before, after = long_context_peak()
        scores = 8 * 16384 * 16384 * 4 / 2**30
        print(f"\nlong context (1, 16384, 512, 8), fast path: RSS {before:.2f} GiB before, peak {after:.2f} GiB during "
              f"the forward (+{(after - before) * 1024:.0f} MiB); materialized (H, L, L) float32 scores alone would "
              f"take {scores:.1f} GiB ({8 * 16384 * 16384 * 4 / 1e9:.1f} GB)")
    return 0 if math.isfinite(rate) else 1


if __name__ == "__main__":
    sys.exit(main())
