"""The truth table: the gate (properties; export is the export stage's business) on each
ecosystem layer, with the user code of tests/ecosystem/layers.py and nothing else.

Every FAIL must be a true finding, reproduced with plain torch in test_findings.py; any other
failure is a false alarm and fails this test. Skipped with the reason when a library is missing.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = "tests/ecosystem/layers.py:"

# layer -> (library it needs, the properties that fail because of a true finding, and which)
TRUTH: dict[str, tuple[str | None, dict[str, str]]] = {
    "timm_attention": ("timm", {}),
    "timm_attention_unfused": ("timm", {
        "*": "NaN on fully masked rows (masked_fill(-inf) + softmax); the fused path gives b_o "
             "(test_timm_unfused_path_gives_nan_on_a_fully_masked_row_where_the_fused_path_gives_b_o)"}),
    "bert_self_attention": ("transformers", {}),
    "bert_self_attention_eager": ("transformers", {}),
    "gpt2_attention": ("transformers", {}),
    "gpt2_attention_eager": ("transformers", {}),
    "llama_gqa_attention": ("transformers", {}),
    "x_transformers_attention": ("x_transformers", {
        "gradcheck": "softmax in float32 for float64 inputs "
                     "(test_x_transformers_runs_its_softmax_in_float32_for_float64_inputs)"}),
    "torchtune_attention": ("torchtune", {}),
    "torch_mha_batch_first": (None, {}),
    "torch_mha_seq_first": (None, {}),
}


def _installed(lib: str | None) -> bool:
    if lib is None:
        return True
    if lib == "timm":
        from tests.ecosystem.layers import timm_layers

        try:
            timm_layers()
        except ImportError:
            return False
        return True
    return importlib.util.find_spec(lib) is not None


@pytest.mark.slow
@pytest.mark.parametrize("layer", list(TRUTH))
def test_every_failure_is_a_true_finding(layer: str, tmp_path: Path) -> None:
    lib, findings = TRUTH[layer]
    if not _installed(lib):
        pytest.skip(f"{lib} is not installed (tox -e ecosystem installs it; see tests/ecosystem/requirements.txt)")
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "mha_verify.cli", "--no-export", "--max-examples", "10",
                           "--target", LAYERS + layer, "--report", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert report.exists(), proc.stderr[-2000:]
    results = json.loads(report.read_text())["results"]
    failed = {r["name"]: r.get("reason") for r in results if r["verdict"] == "fail"}
    passed = [r["name"] for r in results if r["verdict"] == "pass"]
    assert passed, "nothing was verified"
    if "*" not in findings:
        unexplained = {n: why for n, why in failed.items() if n not in findings}
        assert not unexplained, f"false alarms on {layer}: {unexplained}"
    else:
        assert failed, f"{layer}: the known finding was not found"
    assert proc.returncode == (1 if failed else 0)
