"""Whole exported models that take token ids, validated against the eager model they came from
(``mha-verify validate MODEL.onnx --eager SPEC``): the inputs read from their names, refusals that
name the input and the flag, and the one-bug twins of ``tests/fixtures/token_models.py`` caught by
the relation each breaks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from mha_verify.properties.model.batches import make_batch
from mha_verify.properties.model.inputs import parse_model_inputs, read_model_inputs, takes_token_ids
from mha_verify.properties.onnx.model_file import ModelError

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = "tests/fixtures/token_models.py"
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import token_models  # noqa: E402


def _validate(model: Path, eager: str, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(model), "--eager",
                           f"{FIXTURE}:{eager}", "--profile", "quick", *more],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def _verdicts(stdout: str) -> dict[str, str]:
    rows = [line.split() for line in stdout.splitlines() if line.startswith("  ") and len(line.split()) >= 3]
    return {row[0]: row[2] for row in rows if row[0] in ("outputs_agree", "padding_invariance", "batch_independence",
                                                          "fully_padded_finite")}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("token_models")
    out = {}
    for name, factory, positions in (("encoder", token_models.encoder, False),
                                     ("mask_dropped", token_models.mask_dropped, False),
                                     ("finfo_min_mask", token_models.finfo_min_mask, False),
                                     ("mask_positions", token_models.mask_positions, False),
                                     ("positions_off_by_one", token_models.positions_off_by_one, False)):
        out[name] = folder / f"{name}.onnx"
        token_models.export(factory(), str(out[name]), position_ids=positions)
    return out


@pytest.mark.deep
def test_a_correct_export_passes_every_relation(exported: dict[str, Path]) -> None:
    done = _validate(exported["encoder"], "encoder")
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(_verdicts(done.stdout).values()) == {"ok"}, done.stdout
    # absolute positions counted over padding: the eager model keeps right padding only, and says so
    assert "padding kept by the eager model on: right;" in done.stdout or \
        "padding kept by the eager model on: right\n" in done.stdout, done.stdout
    assert "inputs input_ids <- input_ids, attention_mask <- attention_mask" in done.stdout


@pytest.mark.deep
def test_a_graph_whose_mask_is_dropped_in_one_layer_fails(exported: dict[str, Path]) -> None:
    done = _validate(exported["mask_dropped"], "encoder")
    assert done.returncode == 1, done.stdout + done.stderr
    verdicts = _verdicts(done.stdout)
    assert verdicts["outputs_agree"] == "FAIL" and verdicts["padding_invariance"] == "FAIL", done.stdout


@pytest.mark.deep
def test_positions_off_by_one_fail_where_the_eager_model_counts_real_tokens(exported: dict[str, Path]) -> None:
    ok = _validate(exported["mask_positions"], "mask_positions")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "padding kept by the eager model on: right, left, holes" in ok.stdout  # positions from the mask
    done = _validate(exported["positions_off_by_one"], "mask_positions")
    assert done.returncode == 1 and _verdicts(done.stdout)["outputs_agree"] == "FAIL", done.stdout


def test_a_whole_model_without_an_eager_model_is_a_usage_error(exported: dict[str, Path]) -> None:
    done = subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(exported["encoder"])],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "takes token ids: a whole model" in done.stderr and "--eager DIR" in done.stderr, done.stderr


def _graph(inputs: list[tuple[str, int, list[str]]], extra_outputs: list[tuple[str, int, list]] = ()
           ) -> onnx.ModelProto:
    """A graph of inputs (name, element type, dims) whose first output is its first input's cast, and
    ``extra_outputs`` declared (only the names and shapes are read)."""
    values = [helper.make_tensor_value_info(n, t, dims) for n, t, dims in inputs]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, inputs[0][2])
    more = [helper.make_tensor_value_info(n, t, dims) for n, t, dims in extra_outputs]
    node = helper.make_node("Cast", [inputs[0][0]], ["last_hidden_state"], to=TensorProto.FLOAT)
    return helper.make_model(helper.make_graph([node], "g", values, [out, *more]))


def test_roles_are_read_from_the_names_exporters_write() -> None:
    model = _graph([("input_ids", TensorProto.INT64, ["b", "s"]), ("attention_mask", TensorProto.INT64, ["b", "s"]),
                    ("token_type_ids", TensorProto.INT64, ["b", "s"])])
    assert takes_token_ids(model)
    read = read_model_inputs(model, Path("bert.onnx"))
    assert read.roles == {"input_ids": "input_ids", "attention_mask": "attention_mask",
                          "token_type_ids": "token_type_ids"}
    assert read.outputs == ("last_hidden_state",)


def test_an_input_no_name_says_is_refused_naming_it_and_the_flag() -> None:
    model = _graph([("input_ids", TensorProto.INT64, ["b", "s"]), ("seg", TensorProto.INT64, ["b", "s"])])
    with pytest.raises(ModelError) as info:
        read_model_inputs(model, Path("m.onnx"))
    assert str(info.value) == ("cannot tell the role of input seg (b, s) of m.onnx (inputs: input_ids (b, s), seg (b, "
                               "s)); map it with --model-inputs ROLE=seg (roles: input_ids, attention_mask, "
                               "token_type_ids, position_ids)")
    mapped = read_model_inputs(model, Path("m.onnx"), parse_model_inputs("token_type_ids=seg"))
    assert mapped.roles["token_type_ids"] == "seg"
    with pytest.raises(ValueError, match="ROLE=NAME pairs with ROLE in input_ids"):
        parse_model_inputs("segments=seg")


def test_a_kv_cache_is_read_as_pairs_and_a_cache_in_another_form_is_refused_by_name() -> None:
    inputs = [("input_ids", TensorProto.INT64, ["b", "s"]), ("attention_mask", TensorProto.INT64, ["b", "t"])]
    cache = [("past_key_values.0.key", TensorProto.FLOAT, ["b", 2, "p", 8]),
             ("past_key_values.0.value", TensorProto.FLOAT, ["b", 2, "p", "kv_cache_dim"])]
    presents = [("present.0.key", TensorProto.FLOAT, ["b", 2, "t", 8]),
                ("present.0.value", TensorProto.FLOAT, ["b", 2, "t", 8])]
    read = read_model_inputs(_graph(inputs + cache, extra_outputs=presents), Path("decoder.onnx"))
    assert read.outputs == ("last_hidden_state",)  # the cache's outputs are not compared to the eager model
    assert [(p.past, p.present, p.heads, p.head_dim) for p in read.cache] == [
        ("past_key_values.0.key", "present.0.key", 2, 8), ("past_key_values.0.value", "present.0.value", 2, None)]
    with pytest.raises(ModelError) as info:
        read_model_inputs(_graph(inputs + cache, extra_outputs=presents[:1]), Path("decoder.onnx"))
    assert str(info.value) == ("decoder.onnx takes past_key_values.0.value but returns no present.0.value: a cache "
                               "that is fed but never extended cannot be driven through a decode")
    fused = [("past_0", TensorProto.FLOAT, [2, "b", 2, "p", 8])]  # GPT-2's old export: keys and values in one
    with pytest.raises(ModelError) as info:
        read_model_inputs(_graph(inputs + fused), Path("gpt2.onnx"))
    assert str(info.value) == ("gpt2.onnx takes a KV cache as past_0 (2, b, 2, p, 8), not as the per-layer key and "
                               "value tensors (B, heads, past, head_dim) Optimum and onnxruntime-genai write "
                               "(past_key_values.N.key / .value): its decode schedule cannot be driven")


def test_an_attention_layer_is_not_read_as_a_whole_model() -> None:
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "l", 8]) for n in ("q", "k", "v")]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "l", 8])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["q"], ["out"])], "g", values, [out]))
    assert not takes_token_ids(model)


@pytest.mark.parametrize("padding", ["right", "left", "holes"])
def test_batches_keep_each_items_real_tokens_and_count_positions_over_them(padding: str) -> None:
    batch = make_batch([3, 0, 5], 7, padding, vocab_size=50, type_vocab_size=2, seed=1)
    assert batch.real == [3, 0, 5]
    assert batch.input_ids.shape == (3, 7) and int(batch.input_ids.max()) == 49 and int(batch.input_ids.min()) == 0
    for i, n in enumerate(batch.real):
        keep = batch.attention_mask[i].bool()
        assert batch.position_ids[i][keep].tolist() == list(range(n))
    alone = batch.item(2, unpadded=True)
    assert torch.equal(alone.input_ids[0], batch.input_ids[2][batch.attention_mask[2].bool()])
    with pytest.raises(ValueError, match="item 1 has no real token"):
        batch.item(1, unpadded=True)


def _fused_graph(mask_from: str) -> onnx.ModelProto:
    """onnxruntime's fused BERT shape: EmbedLayerNormalization, then Attention nodes whose mask_index
    comes from ``mask_from`` ("embed": the embedding's count of real tokens; "reducesum"; "mask": a
    2-D mask input, MultiHeadAttention's key padding). Read, never run."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["b", "s"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["b", "s"])
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["b", "s", 8])
    nodes = [helper.make_node("EmbedLayerNormalization", ["input_ids", "", "w", "p", "", "g", "beta", "attention_mask"],
                              ["emb", "mask_index"], name="EmbedLayerNormalization_0", domain="com.microsoft")]
    if mask_from == "reducesum":
        nodes.append(helper.make_node("ReduceSum", ["attention_mask"], ["lengths"], name="ReduceSum_7"))
    index = {"embed": "mask_index", "reducesum": "lengths", "mask": "attention_mask"}[mask_from]
    op = "MultiHeadAttention" if mask_from == "mask" else "Attention"
    inputs = ["emb", "k", "v", "", index] if op == "MultiHeadAttention" else ["emb", "qkv_w", "qkv_b", index]
    nodes += [helper.make_node(op, inputs, [f"a{i}"], name=f"{op}_{i}", domain="com.microsoft", num_heads=2)
              for i in range(2)]
    nodes.append(helper.make_node("Identity", ["a1"], ["last_hidden_state"]))
    return helper.make_model(helper.make_graph(nodes, "fused", [ids, mask], [out]))


@pytest.mark.parametrize(("mask_from", "lengths"), [("embed", True), ("reducesum", True), ("mask", False)])
def test_fused_attention_blocks_are_found_and_a_mask_read_as_lengths_is_a_precondition(mask_from: str,
                                                                                        lengths: bool) -> None:
    from mha_verify.properties.model.graph_blocks import attention_blocks, padding_precondition

    blocks = attention_blocks(_fused_graph(mask_from))
    assert [b.name for b in blocks] == (["MultiHeadAttention_0", "MultiHeadAttention_1"] if mask_from == "mask"
                                        else ["Attention_0", "Attention_1"])
    assert all(b.attributes == {"num_heads": 2} for b in blocks)
    assert all(b.mask == ("lengths" if lengths else "mask") for b in blocks)
    said = padding_precondition(blocks)
    assert bool(said) == lengths
    if lengths:
        assert said.startswith("Attention_0, Attention_1 take the attention mask as lengths") and "#4376" in said


def test_onnxruntimes_optimizer_on_a_bert_export_is_verified_under_right_padding(tmp_path: Path) -> None:
    """A tiny random BERT, exported by torch.onnx with eager attention, fused by onnxruntime's
    transformer optimizer: its Attention nodes read the mask as lengths, so left padding and holes
    are a precondition finding (measured), and right padding is held to the eager model."""
    pytest.importorskip("transformers")
    folder, _, fused = token_models.tiny_bert(tmp_path)
    done = subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(fused), "--eager", str(folder),
                           "--profile", "ci", "--max-examples", "40"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Attention_0 (com.microsoft.Attention; num_heads 4; the mask as lengths" in done.stdout
    verdicts = _verdicts(done.stdout)
    assert verdicts["padding_invariance"] == verdicts["batch_independence"] == "ok", done.stdout
    assert "outside a documented precondition" in done.stdout, done.stdout
    blocks = [line.split() for line in done.stdout.splitlines() if line.startswith("  block Attention_")]
    assert [(row[1], row[3]) for row in blocks] == [("Attention_0", "ok"), ("Attention_1", "ok")], done.stdout


@pytest.mark.deep
def test_a_fully_padded_item_that_differs_fails_where_nothing_declares_padding(exported: dict[str, Path]) -> None:
    """A graph whose fully padded items average every key where the eager model's SDPA gives zeros
    (what torch.onnx's dynamo exporter does at opset 20; onnxscript#2479 made the export match aten's
    behaviour, so its maintainers hold it a bug). The plain-torch eager model declares nothing of its
    padded rows, so this fails; only a transformers model's would be unspecified by its library."""
    done = _validate(exported["finfo_min_mask"], "encoder", "--only", "outputs_agree,fully_padded_finite")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "last_hidden_state at fully padded items, onnxruntime vs the eager model" in done.stdout, done.stdout
    assert _verdicts(done.stdout)["fully_padded_finite"] == "ok"


def test_the_precision_is_read_from_the_outputs_or_the_weights_and_bfloat16_is_refused() -> None:
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    for dtype, precision in ((TensorProto.FLOAT16, "float16"), (TensorProto.FLOAT, "float32")):
        out = helper.make_tensor_value_info("logits", dtype, ["b", "s", 4])
        node = helper.make_node("Cast", ["input_ids"], ["logits"], to=dtype)
        model = helper.make_model(helper.make_graph([node], "g", [ids], [out]))
        assert read_model_inputs(model, Path("m.onnx")).precision == precision
    # float32 in and out, float16 inside (onnxruntime's keep_io_types): read from the weights
    weights = [helper.make_tensor(f"w{i}", TensorProto.FLOAT16, [2, 2], [0.0] * 4) for i in range(3)]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 4])
    node = helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)
    model = helper.make_model(helper.make_graph([node], "g", [ids], [out], initializer=weights))
    assert read_model_inputs(model, Path("kept_io.onnx")).precision == "float16"
    out = helper.make_tensor_value_info("logits", TensorProto.BFLOAT16, ["b", "s", 4])
    node = helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.BFLOAT16)
    model = helper.make_model(helper.make_graph([node], "g", [ids], [out]))
    with pytest.raises(ModelError) as info:
        read_model_inputs(model, Path("bf16.onnx"))
    assert str(info.value) == ("bf16.onnx computes in bfloat16: onnxruntime's CPU kernels do not run bfloat16 graphs, "
                               "so it is not validated here (float32 and float16 are)")


@pytest.mark.deep
def test_a_float16_conversion_is_held_with_the_allowance_of_the_eager_model_in_float16(tmp_path: Path) -> None:
    """onnxruntime's float16 converter on the plain encoder: every relation holds within the eager
    model's own float16 error (a float32 allowance would fail it, 1e-3 against 1e-6)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    token_models.export(token_models.encoder(), str(tmp_path / "enc.onnx"))
    onnx.save(convert_float_to_float16(onnx.load(str(tmp_path / "enc.onnx")), keep_io_types=False),
              str(tmp_path / "enc16.onnx"))
    done = _validate(tmp_path / "enc16.onnx", "encoder")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "computes in float16: the allowance comes from the eager model in float16" in done.stdout
    assert set(_verdicts(done.stdout).values()) == {"ok"}, done.stdout
