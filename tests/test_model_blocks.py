"""Each fused attention block of a whole model found, cut out with its projections and held to the
float64 oracle by the property registry, named by its node; a node whose attributes state another
attention than its eager model's (the scale of 1/sqrt(D) where the model scales by 1/sqrt(Hd)) fails,
named, and so does a GroupQueryAttention whose rotary caches depart from its eager model's RoPE. The
models are tests/fixtures/fused_models.py (the optimizer's ``Attention`` and ``MultiHeadAttention``)
and tests/fixtures/grouped_models.py (the genai builder's ``GroupQueryAttention``): hand-written
graphs, no transformers needed; and the ONNX ``Attention`` op of torch.onnx's opset-23 export of
tests/fixtures/token_models.py, extracted from the graph."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from mha_verify.mha.reference import MHAParams, multi_head
from mha_verify.properties.model.block_cut import cut_block
from mha_verify.properties.model.eager import AttentionDims
from mha_verify.properties.model.graph_blocks import Block, attention_blocks, disagreements
from mha_verify.properties.onnx.interface import read_interface
from mha_verify.properties.onnx.model_file import ModelError
from mha_verify.properties.onnx.ort_target import params_from_graph

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = "tests/fixtures/fused_models.py"
GROUPED = "tests/fixtures/grouped_models.py"
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import fused_models  # noqa: E402
import grouped_models  # noqa: E402
import token_models  # noqa: E402


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fused")
    model = fused_models.fused_tiny()
    return {"fused": fused_models.write_fused(model, folder / "fused.onnx"),
            "scale": fused_models.write_fused(model, folder / "scale.onnx", scale=fused_models.WIDTH ** -0.5),
            "mha": fused_models.write_fused(model, folder / "mha.onnx", op="MultiHeadAttention")}


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("grouped")
    model = grouped_models.grouped_tiny()
    return {"gqa": grouped_models.write_grouped(model, folder / "gqa.onnx"),
            "base": grouped_models.write_grouped(model, folder / "base.onnx", cache_base=500000.0),
            "softcap": grouped_models.write_grouped(model, folder / "softcap.onnx", softcap=30.0),
            "separate": grouped_models.write_grouped(model, folder / "separate.onnx", packed=False)}


def _validate(model: Path, *more: str, eager: str = f"{FIXTURE}:fused_tiny") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(model), "--eager",
                           eager, "--profile", "quick", *more],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def _row(stdout: str, name: str) -> list[str]:
    rows = [line.split() for line in stdout.splitlines() if line.startswith(f"  {name} ")]
    assert len(rows) == 1, stdout
    return rows[0]


def test_a_cut_block_computes_the_nodes_attention_with_its_projections(graphs: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    """The cut file, run by onnxruntime, against the reference formula in float64 with the fixture's
    own weights (not read back from the graph): packed q/k/v, 4 heads, output projection and bias."""
    model = onnx.load(str(graphs["fused"]))
    (block,) = attention_blocks(model)
    cut = cut_block(model, block, tmp_path / "block.onnx").path
    eager = fused_models.fused_tiny()
    d = fused_models.WIDTH
    w = eager.qkv.detach().double()
    q, k, v = (w[:, i * d:(i + 1) * d].T for i in range(3))
    bq, bk, bv = (eager.qkv_bias.detach().double()[i * d:(i + 1) * d] for i in range(3))
    params = MHAParams(q, bq, k, bk, v, bv, eager.out.weight.detach().double(), eager.out.bias.detach().double())
    x = torch.randn(2, 5, d, generator=torch.Generator().manual_seed(1))
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    bias = torch.zeros(2, 1, 5, 5).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)
    got = ort.InferenceSession(str(cut)).run(None, {"x": x.numpy(), "attention_bias": bias.numpy()})[0]
    want, _ = multi_head(x, x, x, params, fused_models.HEADS, keep[:, None, None, :])
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


@pytest.mark.deep
@pytest.mark.parametrize("form", ["fused", "mha"])
def test_blocks_are_verified_by_the_registry_and_named(graphs: dict[str, Path], form: str) -> None:
    """The packed form (``Attention``) and the separate one (three MatMuls, then ``MultiHeadAttention``
    adding the q/k/v biases from its packed bias input: read back for the oracle, or it would fail)."""
    done = _validate(graphs[form])
    assert done.returncode == 0, done.stdout + done.stderr
    op = {"fused": "Attention", "mha": "MultiHeadAttention"}[form]
    assert f"Attention_0 (com.microsoft.{op}; num_heads 4; the mask as lengths from MaskLengths" in done.stdout
    assert _row(done.stdout, "block Attention_0")[3] == "ok", done.stdout
    assert int(_row(done.stdout, "block Attention_0")[2]) > 0, done.stdout  # examples: it compared something
    assert "Attention_0 takes the attention mask as lengths" in done.stdout


@pytest.mark.deep
def test_a_node_scaled_by_another_head_size_fails_named(graphs: dict[str, Path]) -> None:
    """The twin's node says scale 1/sqrt(D): the whole model disagrees with its eager model, and the
    block names the attribute that makes it so."""
    done = _validate(graphs["scale"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert _row(done.stdout, "outputs_agree")[2] == "FAIL", done.stdout
    assert _row(done.stdout, "block Attention_0")[3] == "FAIL", done.stdout
    assert "scale 0.25 where the eager model's is 1/sqrt(head_dim 4) = 0.5" in done.stdout


@pytest.mark.deep
def test_no_blocks_skips_them_and_is_refused_for_a_layer_file(graphs: dict[str, Path]) -> None:
    done = _validate(graphs["fused"], "--no-blocks")
    assert done.returncode == 0 and "block Attention_0" not in done.stdout, done.stdout + done.stderr


def test_disagreements_read_heads_and_scale_against_the_config() -> None:
    block = Block("Attention_3", "com.microsoft.Attention", {"num_heads": 2, "scale": 0.25}, "lengths", "m")
    dims = AttentionDims(heads=4, kv_heads=4, head_dim=4, scale=0.5)
    assert disagreements(block, dims) == [
        "num_heads 2 where the eager model's config has num_attention_heads 4",
        "scale 0.25 where the eager model's is 1/sqrt(head_dim 4) = 0.5"]
    assert disagreements(block, AttentionDims(2, 2, 8, None)) == []  # a config naming other scaling: not judged
    gqa = Block("g", "com.microsoft.GroupQueryAttention", {"num_heads": 4, "kv_num_heads": 1}, "lengths", "")
    assert disagreements(gqa, AttentionDims(4, 2, 16, 0.25)) == [
        "kv_num_heads 1 where the eager model's config has 2 key/value heads"]


def test_a_block_of_another_op_is_not_cut_and_says_so(tmp_path: Path) -> None:
    model = onnx.load(str(fused_models.write_fused(fused_models.fused_tiny(), tmp_path / "f.onnx")))
    other = Block("Attention_9", "onnx.Attention", {}, "mask", "")
    with pytest.raises(ModelError, match=r"Attention_9 .* is not cut out yet: only com\.microsoft\.Att"):
        cut_block(model, other, tmp_path / "cut.onnx")


@pytest.mark.parametrize("form", ["gqa", "separate"])
def test_a_cut_grouped_block_computes_the_models_attention(grouped: dict[str, Path], tmp_path: Path,
                                                           form: str) -> None:
    """The cut GroupQueryAttention (q/k/v packed or by three MatMuls, 4 query heads over 2 key/value heads,
    RoPE from its caches, causal) run by onnxruntime against the fixture's own torch attention, mask
    through the additive bias; its RoPE stated in the file as the eager config's and, without a config,
    as read from the caches; its weights read back for the oracle as the fixture's."""
    model = onnx.load(str(grouped[form]))
    (block,) = attention_blocks(model)
    config = AttentionDims(4, 2, 16, 0.25, rope_base=10000.0, rope_type="default")
    cut = cut_block(model, block, tmp_path / "block.onnx", config)
    assert cut.notes == ()
    eager = grouped_models.grouped_tiny()
    x = torch.randn(2, 7, grouped_models.WIDTH, generator=torch.Generator().manual_seed(1))
    keep = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    bias = torch.zeros(2, 1, 7, 7).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)
    got = ort.InferenceSession(str(cut.path)).run(None, {"x": x.numpy(), "attention_bias": bias.numpy()})[0]
    want = eager.attend(x, keep).detach().numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    said = {p.key: p.value for p in onnx.load(str(cut.path)).metadata_props}
    assert said["rotary"] == "10000.0;false;1.0;false" and said["rows_unspecified"] == "true", said
    read = cut_block(model, block, tmp_path / "read.onnx")  # no config: the base its caches hold
    assert {p.key: p.value for p in onnx.load(str(read.path)).metadata_props}["rotary"] == "10000.0;false;1.0;false"
    params = params_from_graph(read_interface(cut.path))
    kv = grouped_models.KV_HEADS * grouped_models.HEAD_DIM
    for got_w, want_w in zip((params.w_q, params.w_k, params.w_v),
                             eager.qkv.detach().split([grouped_models.WIDTH, kv, kv], dim=1), strict=True):
        assert torch.equal(got_w, want_w.T)
    assert torch.equal(params.w_o, eager.out.weight.detach())


@pytest.mark.deep
def test_a_grouped_block_is_verified_and_its_cache_departure_fails(grouped: dict[str, Path]) -> None:
    """The block holds under the registry (GQA, rotary, causal bottom-right read from the node); the twin
    whose cos/sin caches hold base 500000 where the eager config says 10000 fails the whole model and
    the block, which names the departure."""
    done = _validate(grouped["gqa"], eager=f"{GROUPED}:grouped_tiny")
    assert done.returncode == 0, done.stdout + done.stderr
    row = _row(done.stdout, "block GroupQueryAttention_0")
    # every check held or n/a; what a fully masked row gives (never fed by the model) said, not passed
    assert row[3] == "finding" and int(row[2]) > 0, done.stdout
    assert "0 failed, 2 findings (fully_masked_rows (unspecified by its library))" in done.stdout
    assert _row(done.stdout, "padding_invariance")[2] == "ok", done.stdout
    twin = _validate(grouped["base"], eager=f"{GROUPED}:grouped_tiny")
    assert twin.returncode == 1, twin.stdout + twin.stderr
    assert _row(twin.stdout, "outputs_agree")[2] == "FAIL", twin.stdout
    assert _row(twin.stdout, "block GroupQueryAttention_0")[3] == "FAIL", twin.stdout
    assert "its cos/sin caches are not the eager config's RoPE of base 10000 (position" in twin.stdout
    assert "oracle_agreement" in twin.stdout


def test_a_grouped_block_beyond_the_oracle_is_refused_by_name(grouped: dict[str, Path], tmp_path: Path) -> None:
    model = onnx.load(str(grouped["softcap"]))
    (block,) = attention_blocks(model)
    with pytest.raises(ModelError, match=r"GroupQueryAttention_0 takes softcap 30\.0: not cut out yet"):
        cut_block(model, block, tmp_path / "cut.onnx")
    plain = onnx.load(str(grouped["gqa"]))
    scaled = AttentionDims(4, 2, 16, 0.25, rope_base=10000.0, rope_type="llama3")
    with pytest.raises(ModelError, match=r"rotates by the eager config's 'llama3' rotary .*only plain RoPE"):
        cut_block(plain, attention_blocks(plain)[0], tmp_path / "cut.onnx", scaled)


@pytest.fixture(scope="module")
def attention_op(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("opset23")
    paths = {"rows": folder / "rows.onnx", "keys": folder / "keys.onnx"}
    token_models.export_attention_op(token_models.query_axis_mask(), str(paths["rows"]))
    token_models.export_attention_op(token_models.encoder(), str(paths["keys"]))
    return paths


@pytest.mark.deep
def test_onnx_attention_op_blocks_are_extracted_and_verified(attention_op: dict[str, Path]) -> None:
    """torch.onnx at opset 23 writes scaled_dot_product_attention as the ONNX ``Attention`` op, q/k/v
    from one packed Linear split in three, weights beside the model as external data: each node is
    extracted with its projections and its boolean mask, and held to the oracle."""
    model = onnx.load(str(attention_op["rows"]))
    cut = cut_block(model, attention_blocks(model)[0], attention_op["rows"].with_name("cut.onnx"))
    said = {p.key: p.value for p in onnx.load(str(cut.path)).metadata_props}
    # heads from the node's own q (B, H, L, Hd), not a vote over the graph's Reshapes (transformers 4.57's
    # BERT export voted 8 of its 4 heads, and both blocks failed the oracle for it)
    assert (said["n_head"], said["mask_kind"]) == (str(token_models.HEADS), "keep"), said
    done = _validate(attention_op["rows"], eager="tests/fixtures/token_models.py:encoder")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attention blocks in the graph: 2" in done.stdout
    for node in ("node_scaled_dot_product_attention", "node_scaled_dot_product_attention_1"):
        row = _row(done.stdout, f"block {node}")
        assert row[3] == "ok" and int(row[2]) > 0, done.stdout


@pytest.mark.deep
def test_a_mask_the_onnx_op_broadcasts_and_onnxruntime_refuses_fails(attention_op: dict[str, Path]) -> None:
    """A (B, 1, 1, L) key-padding mask, broadcastable as the ONNX operator says, is refused by onnxruntime's
    CPU kernel at run time (it requires the query axis): the model and each block fail, the cause named."""
    done = _validate(attention_op["keys"], eager="tests/fixtures/token_models.py:encoder")
    assert done.returncode == 1, done.stdout + done.stderr
    assert _row(done.stdout, "outputs_agree")[2] == "FAIL", done.stdout
    assert _row(done.stdout, "block node_scaled_dot_product_attention")[3] == "FAIL", done.stdout
    assert "inconsistent q_sequence_length (between attn_mask and Q)" in done.stdout
