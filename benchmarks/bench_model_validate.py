"""Whole exported text models validated end to end against their eager models, one row per pipeline:
the inputs ``validate`` read, the attention blocks it found, its verdicts by kind, and the seconds
the whole command took (issue 34's target: a tiny 2-layer model in the ci profile within 120 s).

    python -m benchmarks.bench_model_validate OUT [--profile ci]

Pipelines (each model random-initialized from a tiny config and saved locally; nothing downloaded):

* ``torch.onnx`` of the plain-torch 2-layer encoder of tests/fixtures/token_models.py, and of its
  one-bug twins (a mask dropped in one layer, positions off by one);
* ``torch.onnx`` of a tiny BERT (transformers, eager attention), and the same file through
  onnxruntime's transformer optimizer (fused ``com.microsoft.Attention``);

BERT rows are left out, with the reason, where transformers is not installed. Seconds are wall
time of one ``mha-verify validate`` process each, measured side by side in this run.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 120.0


def _token_models():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import token_models

    return token_models


def _row(pipeline: str, model: Path, eager: str, profile: str) -> str:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(model), "--eager", eager,
                           "--profile", profile], cwd=ROOT, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    inputs = re.search(r"inputs (.*?); outputs", done.stdout)
    blocks = re.search(r"attention blocks in the graph: (\d+)", done.stdout)
    lengths = "; mask as lengths" if "the mask as lengths" in done.stdout else ""
    verdicts = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in ("outputs_agree", "padding_invariance", "batch_independence",
                                             "fully_padded_finite"):
            verdicts[parts[0]] = parts[2]
    kinds = re.search(r"\d+ passed, \d+ failed.*", done.stdout)
    return (f"| {pipeline} | {inputs.group(1) if inputs else '?'} | {blocks.group(1) if blocks else '?'}{lengths} | "
            f"{', '.join(f'{k} {v}' for k, v in verdicts.items())} | {kinds.group(0) if kinds else done.stderr[-200:]} "
            f"| {done.returncode} | {seconds:.1f} ({seconds / TARGET_SECONDS:.2f} of {TARGET_SECONDS:.0f}) |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--profile", default="ci", choices=("quick", "ci", "thorough"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tm = _token_models()
    fixture = "tests/fixtures/token_models.py"
    rows = []
    for name, factory, eager in (("encoder", tm.encoder, "encoder"), ("mask_dropped", tm.mask_dropped, "encoder"),
                                 ("positions_off_by_one", tm.positions_off_by_one, "mask_positions")):
        path = args.out / f"{name}.onnx"
        tm.export(factory(), str(path))
        rows.append(_row(f"torch.onnx, plain 2-layer encoder: {name}", path, f"{fixture}:{eager}", args.profile))
    if importlib.util.find_spec("transformers") is None:
        rows.append("| tiny BERT (torch.onnx; onnxruntime's optimizer) | left out: transformers is not installed |"
                    " | | | | |")
    else:
        folder, plain, fused = tm.tiny_bert(args.out)
        rows.append(_row("torch.onnx, tiny BERT (eager attention)", plain, str(folder), args.profile))
        rows.append(_row("onnxruntime transformer optimizer on it (fused Attention)", fused, str(folder), args.profile))
    print(f"profile {args.profile}; torch {torch.__version__}")
    print("| pipeline | inputs read | attention blocks | verdicts | summary | exit | seconds (of target) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
