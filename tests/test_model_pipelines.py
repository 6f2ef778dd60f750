"""The pipelines people deploy through, end to end on tiny random-init models saved locally (no hub
download): HF Optimum's ``optimum-cli export onnx`` (a BERT encoder; a Llama decoder with its KV
cache, ``text-generation-with-past``) and onnxruntime-genai's model builder (the same Llama, fused
into GroupQueryAttention), each validated against its eager model.

Optimum needs transformers < 4.58 and the genai builder transformers 5, so each runs in a tox
environment of its own (``tox -e optimum``, ``tox -e genai``); elsewhere these tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import pipeline_models  # noqa: E402

CHECKS = ("outputs_agree", "padding_invariance", "batch_independence", "fully_padded_finite", "cache_consistency")

pytestmark = pytest.mark.deep  # whole-model pipelines (tox -e optimum, tox -e genai)


def _needs(module: str, env: str) -> None:
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is absent
        found = False
    if not found:
        pytest.skip(f"{module} is not installed: run tox -e {env}")


def _validate(model: Path, eager: Path) -> subprocess.CompletedProcess[str]:
    return pipeline_models.run("-m", "mha_verify.cli", "validate", str(model), "--eager", str(eager), "--profile",
                               "ci", cwd=ROOT)


def _verdicts(stdout: str) -> dict[str, str]:
    rows = [line.split() for line in stdout.splitlines() if line.startswith("  ") and len(line.split()) >= 3]
    return {row[0]: row[2] for row in rows if row[0] in CHECKS}


def test_optimum_bert_export_passes_every_relation_it_claims(tmp_path: Path) -> None:
    _needs("optimum.exporters.onnx", "optimum")
    folder = pipeline_models.tiny_bert(tmp_path / "bert")
    done = _validate(pipeline_models.optimum_export(folder, "feature-extraction", tmp_path / "onnx"), folder)
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = _verdicts(done.stdout)
    assert verdicts == {**dict.fromkeys(CHECKS[:4], "ok"), "cache_consistency": "n/a"}, done.stdout
    assert "not left: the eager model itself changes real tokens' outputs" in done.stdout  # absolute positions


def test_optimum_llama_with_past_is_driven_through_its_cache(tmp_path: Path) -> None:
    _needs("optimum.exporters.onnx", "optimum")
    folder = pipeline_models.tiny_llama(tmp_path / "llama")
    done = _validate(pipeline_models.optimum_export(folder, "text-generation-with-past", tmp_path / "onnx"), folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "KV cache: 4 tensors (past_key_values.0.key -> present.0.key, ...)" in done.stdout
    assert _verdicts(done.stdout) == dict.fromkeys(CHECKS, "ok"), done.stdout


def test_genai_builder_llama_is_held_within_group_query_attentions_preconditions(tmp_path: Path) -> None:
    """The builder fuses attention into GroupQueryAttention, which reads the mask as lengths: held to
    every relation under right padding; left padding and holes measured and said as outside its
    precondition; no item is drawn without a real token (onnxruntime refuses seqlens_k = -1)."""
    _needs("onnxruntime_genai", "genai")
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"onnxruntime-genai's builder imports classes of transformers 5 (installed: "
                    f"{transformers.__version__}): run tox -e genai")
    folder = pipeline_models.tiny_llama(tmp_path / "llama")
    done = _validate(pipeline_models.genai_build(folder, tmp_path / "genai"), folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GroupQueryAttention" in done.stdout and "precondition:" in done.stdout, done.stdout
    verdicts = _verdicts(done.stdout)
    assert verdicts["fully_padded_finite"] == "n/a", done.stdout
    assert verdicts["batch_independence"] == "ok", done.stdout
    assert verdicts["cache_consistency"] in ("ok", "finding"), done.stdout  # a finding: outside its precondition
    assert "FAIL" not in verdicts.values(), done.stdout
    blocks = [line.split() for line in done.stdout.splitlines() if line.startswith("  block /model/layers.")]
    # each held to the oracle, what a fully masked row gives (never fed by the model) a finding
    assert len(blocks) == 2 and all(row[3] == "finding" and int(row[2]) > 0 for row in blocks), done.stdout
    assert done.stdout.count("0 failed, 2 findings (fully_masked_rows (unspecified by its library))") == 2
