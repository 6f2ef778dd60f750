"""Whole exported text models validated end to end against their eager models, one row per pipeline:
the inputs ``validate`` read, the attention blocks it found, its verdicts by kind, and the seconds
the whole command took (issue 34's target: a tiny 2-layer model in the ci profile within 120 s).

    python -m benchmarks.bench_model_validate OUT [--profile ci]

Pipelines (each model random-initialized from a tiny config and saved locally; nothing downloaded):

* ``torch.onnx`` of the plain-torch 2-layer encoder of tests/fixtures/token_models.py, and of its
  one-bug twins (a mask dropped in one layer, positions off by one);
* ``torch.onnx`` at opset 23 (the ONNX ``Attention`` op) of that encoder, its mask (B, 1, 1, L) and
  expanded to (B, 1, L, L);
* the hand-written ``GroupQueryAttention`` model of tests/fixtures/grouped_models.py, and its twin
  whose rotary caches hold another base than its config's;
* ``torch.onnx`` of the plain-torch 2-layer decoder with its KV cache of
  tests/fixtures/decoder_models.py, and of its twin whose decode step's causal mask is aligned
  top-left;
* ``torch.onnx`` of a tiny BERT (transformers, eager attention), and the same file through
  onnxruntime's transformer optimizer (fused ``com.microsoft.Attention``), and the same BERT with SDPA
  attention at opset 23 (the ONNX ``Attention`` op);
* HF Optimum's ``optimum-cli export onnx`` of a tiny BERT and of a tiny Llama with its cache
  (``text-generation-with-past``), where optimum-onnx is installed (``tox -e optimum``'s env);
* onnxruntime-genai's builder on the tiny Llama (``GroupQueryAttention``), where it is installed
  with transformers 5 (``tox -e genai``'s env).

A row whose tool is not installed is printed with the reason. Seconds are wall time of one
``mha-verify validate`` process each, measured side by side in this run.
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


def _fixtures():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import decoder_models
    import grouped_models
    import pipeline_models
    import token_models

    return token_models, decoder_models, pipeline_models, grouped_models


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is absent
        return False


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
                                             "fully_padded_finite", "cache_consistency"):
            verdicts[parts[0]] = parts[2]
        elif len(parts) >= 4 and parts[0] == "block":  # "block NODE examples verdict ...": one per fused block
            verdicts[f"block {parts[1]}"] = parts[3]
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
    tm, dm, pm, gm = _fixtures()
    fixture = "tests/fixtures/token_models.py"
    rows = []
    for name, factory, eager in (("encoder", tm.encoder, "encoder"), ("mask_dropped", tm.mask_dropped, "encoder"),
                                 ("positions_off_by_one", tm.positions_off_by_one, "mask_positions")):
        path = args.out / f"{name}.onnx"
        tm.export(factory(), str(path))
        rows.append(_row(f"torch.onnx, plain 2-layer encoder: {name}", path, f"{fixture}:{eager}", args.profile))
    for name, factory in (("query_axis_mask", tm.query_axis_mask), ("key_padding_mask", tm.encoder)):
        path = args.out / f"opset23_{name}.onnx"
        tm.export_attention_op(factory(), str(path))
        rows.append(_row(f"torch.onnx opset 23 (ONNX Attention op), plain 2-layer encoder: {name}", path,
                         f"{fixture}:encoder", args.profile))
    gqa = args.out / "grouped.onnx"
    gm.write_grouped(gm.grouped_tiny(), gqa)
    rows.append(_row("hand-written GroupQueryAttention model (the genai builder's form)", gqa,
                     "tests/fixtures/grouped_models.py:grouped_tiny", args.profile))
    gm.write_grouped(gm.grouped_tiny(), gqa.with_name("grouped_base.onnx"), cache_base=500000.0)
    rows.append(_row("twin: its cos/sin caches of base 500000 where the config says 10000",
                     gqa.with_name("grouped_base.onnx"), "tests/fixtures/grouped_models.py:grouped_tiny",
                     args.profile))
    for name, factory in (("decoder", dm.decoder), ("top_left", dm.top_left)):
        path = dm.export(factory(), args.out / f"{name}.onnx")
        rows.append(_row(f"torch.onnx, plain 2-layer decoder with its KV cache: {name}", path,
                         f"tests/fixtures/decoder_models.py:{name}", args.profile))
    if not _installed("transformers"):
        rows.append("| tiny BERT, tiny Llama (torch.onnx, optimizer, Optimum, genai) | left out: transformers is not "
                    "installed | | | | | |")
        return _print(rows, args.profile)
    folder, plain, fused = tm.tiny_bert(args.out)
    rows.append(_row("torch.onnx, tiny BERT (eager attention)", plain, str(folder), args.profile))
    rows.append(_row("onnxruntime transformer optimizer on it (fused Attention)", fused, str(folder), args.profile))
    rows.append(_row("torch.onnx opset 23, tiny BERT (SDPA: ONNX Attention op)",
                     tm.bert_attention_op(folder, args.out / "bert23.onnx"), str(folder), args.profile))
    if _installed("optimum.exporters.onnx"):
        bert = pm.tiny_bert(args.out / "optimum-bert")
        rows.append(_row("Optimum, tiny BERT (feature-extraction)",
                         pm.optimum_export(bert, "feature-extraction", args.out / "optimum-bert-onnx"), str(bert),
                         args.profile))
        llama = pm.tiny_llama(args.out / "optimum-llama")
        rows.append(_row("Optimum, tiny Llama (text-generation-with-past)",
                         pm.optimum_export(llama, "text-generation-with-past", args.out / "optimum-llama-onnx"),
                         str(llama), args.profile))
    else:
        rows.append("| Optimum (BERT; Llama with past) | left out: optimum-onnx is not installed (tox -e optimum) "
                    "| | | | | |")
    import transformers

    if _installed("onnxruntime_genai") and int(transformers.__version__.split(".")[0]) >= 5:
        llama = pm.tiny_llama(args.out / "genai-llama")
        rows.append(_row("onnxruntime-genai builder, tiny Llama (fp32, cpu)",
                         pm.genai_build(llama, args.out / "genai-llama-onnx"), str(llama), args.profile))
    else:
        rows.append("| onnxruntime-genai builder (Llama) | left out: onnxruntime-genai with transformers 5 is not "
                    "installed (tox -e genai) | | | | | |")
    return _print(rows, args.profile)


def _print(rows: list[str], profile: str) -> int:
    print(f"profile {profile}; torch {torch.__version__}")
    print("| pipeline | inputs read | attention blocks | verdicts | summary | exit | seconds (of target) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
