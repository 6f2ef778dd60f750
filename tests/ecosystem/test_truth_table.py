"""The truth table: the whole gate, ONNX export stage included, on each ecosystem layer, with
the user code of tests/ecosystem/layers.py and nothing else (docs/reach.md has the table).

Every FAIL must be a true finding, reproduced with plain torch in test_findings.py; any other
failure is a false alarm and fails these tests. Each layer must export with both exporters
and pass onnxruntime validation, but for its documented findings. Skipped with the reason
when a library is missing.

One gate run per layer (cached for the session) at ``--max-examples 10`` (100 where a finding
needs them, :data:`EXAMPLES`): these tests are about which checks fail and whether export
works, not about search depth; docs/reach.md gives the command of a full ci-profile run.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ecosystem import layers

pytestmark = pytest.mark.deep  # whole gate runs per ecosystem layer (tox -e deep, tox -e ecosystem)

ROOT = Path(__file__).resolve().parents[2]
LAYERS = "tests/ecosystem/layers.py:"
EXPORTERS = ("dynamo", "torchscript")
NAN_ROWS = ("NaN on fully masked rows (masked_fill(-inf) + softmax); the fused path gives b_o "
            "(test_timm_unfused_path_gives_nan_on_a_fully_masked_row_where_the_fused_path_gives_b_o)")
FAST_PATH = ("torch MHA's fast path (inference mode, q is k is v, batch_first) gives NaN on fully masked rows "
             "where its eager path gives b_o (test_torch_mha_fast_path_gives_nan_on_a_fully_padded_item)")

# layer -> (library it needs, {failing check (last part of its name) or "*": the true finding})
# "*": every failure shares the one cause; timm_attention_unfused_nan (the same layer declaring
# it) must then pass everything, which shows that no other failure hides behind it.
TRUTH: dict[str, tuple[str | None, dict[str, str]]] = {
    "timm_attention": ("timm", {}),
    "timm_attention_unfused": ("timm", {"*": NAN_ROWS}),
    "timm_attention_unfused_nan": ("timm", {}),
    "bert_self_attention": ("transformers", {}),
    "bert_self_attention_eager": ("transformers", {}),
    "gpt2_attention": ("transformers", {}),
    "gpt2_attention_eager": ("transformers", {}),
    "llama_gqa_attention": ("transformers", {}),
    "x_transformers_attention": ("x_transformers", {}),
    "torchtune_attention": ("torchtune", {}),
    "torch_mha_batch_first": (None, {}),
    "torch_mha_seq_first": (None, {}),
    "torch_mha_self_attention": (None, {"inference_mode_agreement": FAST_PATH}),
}

# layer -> {check: the kind of its finding that is not a failure (properties/engine/results.py KINDS)}:
# each measured or read from the layer's code, each a true fact (test_findings.py reproduces it)
KINDS: dict[str, dict[str, str]] = {
    # softmax in float32 for float64 inputs: gradcheck n/a, its gradients held by grad_agreement
    # (test_x_transformers_runs_its_softmax_in_float32_for_float64_inputs)
    "x_transformers_attention": {"gradcheck": "precision_policy"},
    # the library's rotary cos and sin in float32 (LlamaRotaryEmbedding), as its model computes them
    "llama_gqa_attention": {"gradcheck": "precision_policy"},
}

# layer -> {exporter: (what every failing onnxruntime check of its model says, the true finding)}:
# a model that exports but cannot run as exported
TS_NAN = ("onnxruntime gives NaN where eager gives finite values",
          "TorchScript's export of torch MHA gives NaN on a fully padded item where eager torch MHA gives b_o "
          "(test_torchscript_opset_20_gives_nan_where_eager_torch_mha_gives_the_bias)")
# layer -> {exporter: (what its failing checks say, the true finding)}: a model that runs but
# differs from the eager layer on some inputs (the checks that meet them fail; the rest pass)
EXPORT_DIVERGENCES: dict[str, dict[str, tuple[str, str]]] = {
    "torch_mha_batch_first": {"torchscript": TS_NAN},
    "torch_mha_seq_first": {"torchscript": TS_NAN},
}
EXPORT_FINDINGS: dict[str, dict[str, tuple[str, str]]] = {
    "torch_mha_self_attention": {"torchscript": (
        "Reshape", "TorchScript fixes the example's length in the Reshape of k after torch MHA's packed "
                   "self-attention projection: onnxruntime fails at other lengths "
                   "(test_torch_mha_called_as_m_x_x_x_exports_with_torchscript_for_its_example_sizes_only)")},
}


# layers whose finding needs more than 10 examples to be met: torch MHA's fast-path NaN needs a
# fully masked row in a mask the fast path takes (a bool key-padding or attention mask); 10
# examples held one in some runs only. The ci profile's 100 hold several.
EXAMPLES: dict[str, int] = {"torch_mha_self_attention": 100}


def _installed(lib: str | None) -> bool:
    if lib is None:
        return True
    if lib == "timm":
        try:
            layers.timm_layers()
        except ImportError:
            return False
        return True
    return importlib.util.find_spec(lib) is not None


_REPORTS: dict[str, tuple[int, list[dict[str, Any]], str]] = {}


def _gate(layer: str, tmp: Path) -> tuple[int, list[dict[str, Any]], str]:
    """(exit code, results, stderr tail) of the whole gate, export included, on ``layer`` (run once)."""
    lib = TRUTH[layer][0]
    if not _installed(lib):
        pytest.skip(f"{lib} is not installed (tox -e ecosystem installs it; see tests/ecosystem/requirements.txt)")
    if layer not in _REPORTS:
        report = tmp / f"{layer}.json"
        proc = subprocess.run([sys.executable, "-m", "mha_verify.cli", "--max-examples", str(EXAMPLES.get(layer, 10)),
                               "--target", LAYERS + layer, "--report", str(report)],
                              cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert report.exists(), proc.stderr[-2000:]
        _REPORTS[layer] = (proc.returncode, json.loads(report.read_text())["results"], proc.stderr[-2000:])
    return _REPORTS[layer]


def _explained(layer: str, result: dict[str, Any]) -> bool:
    """Whether a failed result is a documented true finding of ``layer``."""
    findings = TRUTH[layer][1]
    if "*" in findings or result["name"].rsplit("/", 1)[-1] in findings:
        return True
    exporter = result["name"].split("-", 1)[0] if result["stage"] == "export" else None
    signatures = [table.get(layer, {}).get(exporter or "") for table in (EXPORT_FINDINGS, EXPORT_DIVERGENCES)]
    return any(sig is not None and sig[0] in (result.get("reason") or "") for sig in signatures)


@pytest.mark.serial
@pytest.mark.parametrize("layer", list(TRUTH))
def test_every_failure_is_a_true_finding(layer: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    code, results, _ = _gate(layer, tmp_path_factory.getbasetemp())
    findings = TRUTH[layer][1]
    failed = {r["name"]: r.get("reason") for r in results if r["verdict"] == "fail"}
    assert [r for r in results if r["stage"] == "properties" and r["verdict"] == "pass"], "nothing was verified"
    unexplained = {r["name"]: r.get("reason") for r in results if r["verdict"] == "fail" and not _explained(layer, r)}
    assert not unexplained, f"false alarms on {layer}: {unexplained}"
    for check in findings:  # each documented finding is found (at 10 examples, eager or onnxruntime)
        assert any(check == "*" or n.rsplit("/", 1)[-1] == check for n in failed), f"{layer}: {check} not found"
    assert code == (1 if failed else 0)


@pytest.mark.serial
@pytest.mark.parametrize("layer", list(TRUTH))
def test_every_finding_that_is_not_a_failure_has_its_documented_kind(
        layer: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    _, results, _ = _gate(layer, tmp_path_factory.getbasetemp())
    kinds = {r["name"].rsplit("/", 1)[-1]: r["kind"] for r in results if r.get("kind")}
    assert kinds == KINDS.get(layer, {}), f"{layer}: kinds {kinds}, documented {KINDS.get(layer, {})}"


@pytest.mark.serial
@pytest.mark.parametrize("layer", list(TRUTH))
def test_exports_with_each_exporter_and_validates_in_onnxruntime(
        layer: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    _, results, _ = _gate(layer, tmp_path_factory.getbasetemp())
    findings = TRUTH[layer][1]
    broken = EXPORT_FINDINGS.get(layer, {})
    exported = {r["name"].split("-", 1)[0]: r for r in results if r["stage"] == "export"
                and r["name"].endswith("/export")}
    assert sorted(exported) == sorted(EXPORTERS), f"{layer}: export configurations {sorted(exported)}"
    for exporter, r in exported.items():
        assert r["verdict"] == "pass", f"{layer}: the {exporter} export failed: {r.get('reason')}"
        config = r["name"].rsplit("/", 1)[0]
        checks = {x["name"][len(config) + 1:]: x for x in results if x["name"].startswith(config + "/")}
        assert checks["interface"]["verdict"] == "pass", checks["interface"].get("reason")
        bad = {n: x.get("reason") for n, x in checks.items() if x["verdict"] == "fail" and not _explained(layer, x)}
        assert not bad, f"{layer} {config}: onnxruntime validation fails {bad}"
        if exporter in broken:  # the documented failure, on every check that runs the model
            ran = [x for n, x in checks.items() if n not in ("export", "interface") and x["verdict"] != "n/a"]
            assert ran and all(x["verdict"] == "fail" for x in ran), f"{layer} {config}: {broken[exporter][1]}"
            continue
        # the model runs in onnxruntime and agrees with the eager layer, at both optimization levels
        for opt in ("opt-all", "opt-none"):
            agree = checks[f"cpu/{opt}/ort_vs_eager"]
            assert agree["verdict"] == "pass" or _explained(layer, agree), \
                f"{layer} {config} {opt}: {agree.get('reason')}"
        assert sum(x["verdict"] == "pass" for x in checks.values()) >= 10 or "*" in findings, \
            f"{layer} {config}: too little verified in onnxruntime"


@pytest.mark.serial
def test_user_lines_are_the_factory_bodies() -> None:
    """The "lines of user code" column of docs/reach.md: each factory's body, counted."""
    for name, count in layers.USER_LINES.items():
        lines = inspect.getsource(getattr(layers, name)).strip().splitlines()[1:]  # the body, without the def
        code = [line for line in lines if not line.strip().startswith("#")]  # comment lines are not code
        assert len(code) == count, f"{name}: {len(code)} lines, USER_LINES says {count}"
    assert set(TRUTH) <= set(layers.USER_LINES)
