"""GPU checks in one script, for a machine with an NVIDIA GPU (needs onnxruntime-gpu and a CUDA torch).

    pip install -c constraints.txt '.[gpu]' && python benchmarks/gpu_check.py [--profile ci]

For each (exporter, dtype) in {dynamo, torchscript} x {float32, float16}: export on the GPU
(CUDA tensors while tracing), validate on CUDAExecutionProvider (and TensorRT if present)
and CPUExecutionProvider with the property registry and the onnxruntime-vs-eager check
(``mha_verify.validation``; each provider a target), then compare CUDA EP outputs with CPU EP
outputs directly at larger shapes, and torch's CUDA eager module with the oracle. Prints a summary; exit 1 if anything
failed, 2 if there is no GPU. Not run on the development machine (it has no GPU).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from mha_verify.export.onnx_export import export_onnx
from mha_verify.export_cmds import format_results
from mha_verify.mha.reference import multi_head
from mha_verify.mha.tolerance import compare
from mha_verify.properties.engine import profiles
from mha_verify.properties.onnx.interface import read_interface
from mha_verify.properties.onnx.ort_target import OrtInstance, available_providers, make_session
from mha_verify.properties.targets.eager import load_target
from mha_verify.validation import validate_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=tuple(profiles.PROFILES), default="ci")
    args = parser.parse_args()
    have = available_providers()
    if "cuda" not in have or not torch.cuda.is_available():
        print(f"no GPU here: onnxruntime providers {ort.get_available_providers()}, "
              f"torch.cuda.is_available()={torch.cuda.is_available()}", file=sys.stderr)
        return 2
    providers = [p for p in ("cuda", "tensorrt", "cpu") if p in have]
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, onnxruntime {ort.__version__}, "
          f"providers {providers}")
    settings = profiles.PROFILES[args.profile]
    results = []
    direct: list[str] = []
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for exporter in ("dynamo", "torchscript"):
            for dtype in (torch.float32, torch.float16):
                bound = load_target().build(16, 4, seed=0, dtype=dtype)
                path = Path(tmp) / f"{exporter}-{dtype}.onnx"
                export_onnx(bound, path, exporter=exporter, dtype=dtype, device="cuda")
                bound.module.cpu()
                results += validate_model(path, eager=bound, settings=settings, providers=providers)
                # CUDA EP vs CPU EP and the oracle at larger shapes; torch CUDA eager vs the oracle
                big = load_target().build(256, 8, seed=1, dtype=dtype)
                big_path = Path(tmp) / f"big-{exporter}-{dtype}.onnx"
                export_onnx(big, big_path, exporter=exporter, dtype=dtype)
                info = read_interface(big_path)
                params = big.params()
                cpu_ep = OrtInstance(info, make_session(big_path, "cpu", "opt-all"), params)
                cuda_ep = OrtInstance(info, make_session(big_path, "cuda", "opt-all"), params)
                gen = torch.Generator().manual_seed(0)
                for B, Lq, Lk in ((1, 1, 1), (4, 128, 96), (2, 512, 512)):
                    q, k, v = (torch.randn(B, L, 256, generator=gen).to(dtype) for L in (Lq, Lk, Lk))
                    keep = torch.rand(B, 1, Lq, Lk, generator=gen) < 0.7
                    keep[:, :, 0] = False  # a fully masked row
                    oracle, _ = multi_head(q, k, v, big.params(), 8, keep)
                    same, _ = multi_head(q, k, v, big.params(), 8, keep, dtype=dtype)
                    cpu, cuda = cpu_ep(q, k, v, keep), cuda_ep(q, k, v, keep)
                    with torch.no_grad():
                        eager_cuda = big.module.cuda()(q.cuda(), k.cuda(), v.cuda(), keep.cuda()).cpu()
                    big.module.cpu()
                    for label, got in (("cuda-ep", cuda), ("cpu-ep", cpu), ("torch-cuda", eager_cuda)):
                        c = compare(got, oracle, same, dtype)
                        failed |= not c.ok
                        direct.append(f"{'ok  ' if c.ok else 'FAIL'} {exporter} {dtype} B={B} Lq={Lq} Lk={Lk} "
                                      f"{label} vs oracle: {c}")
                    gap = float(np.abs(cuda.double().numpy() - cpu.double().numpy()).max())
                    direct.append(f"     {exporter} {dtype} B={B} Lq={Lq} Lk={Lk} max|cuda-ep - cpu-ep| = {gap:.3g}")
    print(format_results(results))
    print("\n".join(direct))
    failed |= any(r.failed for r in results)
    print("GPU check:", "FAILED" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
