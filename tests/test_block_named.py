"""Layers written as MONAI and kornia write theirs (tests/fixtures/block_named_layers.py): an attention
class named for a block is found by what its forward computes, a fused qkv beside identity branches is
read as one, key padding unsqueezed to (B, 1, 1, Lk) is read as key padding, the fully masked convention
follows the path the instance's flag takes, and constructors with a LoRA rank, kornia's dropout names or
a dataclass config build with no user code. Each correct layer passes, each one-bug twin fails."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import pytest

from mha_verify.properties.adapters.library_facts import sdpa_taken
from mha_verify.properties.adapters.mask_reading import read_mask
from mha_verify.properties.adapters.structural import table_width
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.targets.eager import load_target
from mha_verify.sweep_classes import computes_attention
from tests.fixtures import block_named_layers

LAYERS = "tests/fixtures/block_named_layers.py:"


def _run(name: str, check: str) -> CheckResult:
    return run_property(all_properties()[check], load_target(LAYERS + name), settings=PROFILES["quick"], seed=0)


def _class(source: str) -> ast.ClassDef:
    node = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(node, ast.ClassDef)
    return node


def test_a_class_named_for_a_block_is_found_by_the_attention_its_forward_computes() -> None:
    assert computes_attention(_class(inspect.getsource(block_named_layers.SABlock)))
    assert computes_attention(_class(inspect.getsource(block_named_layers.ConfigAttention)))  # SDPA called


@pytest.mark.parametrize("source", [
    # a router: a softmax-weighted product with no query, key or value
    "class Router(nn.Module):\n    def forward(self, x):\n        gates = self.w(x).softmax(-1)\n"
    "        return gates @ self.experts\n",
    # a block handing its input to an attention child computes none itself
    "class Block(nn.Module):\n    def forward(self, x):\n        return x + self.attn(self.norm(x))\n",
    # q, k and v named, but no softmax: a linear map
    "class Mixer(nn.Module):\n    def forward(self, q, k, v):\n        return q @ k + v\n",
])
def test_a_softmax_weighted_product_without_attention_operands_is_not_found(source: str) -> None:
    assert not computes_attention(_class(source))


@pytest.mark.deep
def test_a_fused_qkv_beside_identity_branches_is_read_with_key_padding_and_passes() -> None:
    target = load_target(LAYERS + "SABlock")
    conv = target.build(8, 2).conventions
    assert (conv.mask, conv.mask_forms, conv.fully_masked) == (frozenset({"bool"}), frozenset({"B11L"}), "nan")
    for check in ("oracle_agreement", "masked_kv_invariance", "head_split", "batch_independence"):
        result = _run("SABlock", check)
        assert result.verdict == "pass" and result.examples > 0, (check, result.verdict, result.reason)
    fully = _run("SABlock", "fully_masked_rows")  # NaN, as its -inf fill says: declared, not a failure
    assert fully.verdict == "declared", fully.reason


def test_an_sdpa_path_the_instances_flag_takes_keeps_sdpas_convention() -> None:
    off, on = (load_target(LAYERS + name).build(8, 2).module for name in ("SABlock", "SABlockFlash"))
    assert (sdpa_taken(off), sdpa_taken(on)) == (False, True)
    assert load_target(LAYERS + "SABlockFlash").build(8, 2).conventions.fully_masked == "zeros"
    result = _run("SABlockFlash", "fully_masked_rows")
    assert result.verdict == "pass" and result.examples > 0, result.reason


@pytest.mark.deep
def test_the_block_with_its_softmax_over_the_queries_fails() -> None:
    for check in ("oracle_agreement", "masked_kv_invariance"):
        assert _run("SABlockQueryAxis", check).verdict == "fail", check


def test_an_identity_in_place_of_one_projection_is_not_read_as_another_layout() -> None:
    with pytest.raises(TargetError, match="no adapter recognizes OneIdentity"):
        load_target(LAYERS + "OneIdentity").build(8, 2)


def test_key_padding_unsqueezed_twice_is_read_as_key_padding() -> None:
    text = "attn_mask = attn_mask.unsqueeze(1).unsqueeze(2)\nscores = scores.masked_fill(attn_mask == 0, -1e9)"
    reading = read_mask((("its forward", text),), "attn_mask")
    assert (reading.kind, reading.layout, reading.fully_masked) == ("keep", "BL", "uniform")


@pytest.mark.parametrize(("name", "built_as"), [
    ("ConfigAttention", "ConfigAttention(config=VisionConfig(hidden_size=8, num_attention_heads=2, head_dim=4))"),
    ("MultiHeadAttention", "MultiHeadAttention(emb_size=8, num_heads=2, att_drop=0, proj_drop=0, r=1)"),
])
def test_a_dataclass_config_a_lora_rank_and_dropout_names_build_with_no_code(name: str, built_as: str) -> None:
    assert load_target(LAYERS + name).built_as == built_as
    result = _run(name, "oracle_agreement")
    assert result.verdict == "pass" and result.examples > 0, result.reason


CORES = "tests/fixtures/attention_cores.py:"


@pytest.mark.deep
@pytest.mark.parametrize(("name", "layout"), [("EinsumCore", "(B, L, H, Hd)"), ("SdpaCore", "(B, H, L, Hd)")])
def test_an_attention_core_is_verified_inside_projections_the_harness_gives_it(name: str, layout: str) -> None:
    target = load_target(CORES + name)
    assert "inside projections the harness gives it" in target.built_as and layout in target.built_as
    assert "not given" in target.built_as  # its mask arguments: said, not drawn
    assert target.build(8, 2).conventions.mask == frozenset()
    for check in ("oracle_agreement", "key_permutation", "head_split"):
        result = run_property(all_properties()[check], target, settings=PROFILES["quick"], seed=0)
        assert result.verdict == "pass" and result.examples > 0, (check, result.reason)


@pytest.mark.deep
@pytest.mark.parametrize("name", ["EinsumCoreNoRoot", "SdpaCoreLastKeyDropped"])
def test_a_core_with_one_bug_fails_against_the_oracle(name: str) -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(CORES + name), settings=PROFILES["quick"],
                          seed=0)
    assert result.verdict == "fail"


@pytest.mark.parametrize(("name", "words"), [
    ("LinearCore", "computes no softmax the harness can read"),
    ("CoreWithTemperature", "has parameters of its own (temperature)"),
])
def test_what_is_no_attention_core_is_refused_by_name(name: str, words: str) -> None:
    with pytest.raises(TargetError, match=re.escape(words)):
        load_target(CORES + name)


def test_a_softmax_product_whose_operands_are_no_query_or_key_is_not_found() -> None:
    source = ("class Folding(nn.Module):\n    def forward(self, x, structure):\n"
              "        s = (self.w.softmax(0) @ x)\n        return {k: v for k, v in structure.items()}\n")
    assert not computes_attention(_class(source))


def test_a_layer_with_projections_taking_q_k_v_is_built_as_a_layer_not_a_core() -> None:
    target = load_target(CORES + "ProjectedQKV")
    assert target.built_as == "ProjectedQKV(8, 2)"
    result = run_property(all_properties()["oracle_agreement"], target, settings=PROFILES["quick"], seed=0)
    assert result.verdict == "pass" and result.examples > 0, result.reason


@pytest.mark.deep
@pytest.mark.parametrize(("name", "width"), [("TablesFull", 4), ("TablesHalf", 2)])
def test_a_rotarys_tables_handed_in_are_given_a_rotation_by_0_of_the_width_the_layer_takes(name: str,
                                                                                       width: int) -> None:
    bound = load_target(LAYERS + name).build(8, 2)
    assert table_width(bound.module, 4) == width
    assert any(f"cos, sin (a rotary's tables, required) given a rotation by 0 (cos 1, sin 0) of (L, {width})" in n
               for n in bound.conventions.notes)
    assert bound.conventions.head_dim_multiple == 2
    for check in ("oracle_agreement", "batch_independence"):
        result = _run(name, check)
        assert result.verdict == "pass" and result.examples > 0, (check, result.reason)
    assert _run("TablesHalfQueryAxis", "oracle_agreement").verdict == "fail"


@pytest.mark.deep
def test_positions_a_layer_raises_without_are_given_and_its_laws_checked() -> None:
    conv = load_target(LAYERS + "PositionsRequired").build(8, 2).conventions
    assert "forward's position_ids given 0 .. L - 1 for every item" in conv.notes
    assert conv.beyond is not None and conv.beyond_positional  # its rotary: laws only
    for check in ("batch_independence", "masked_kv_invariance"):
        result = _run("PositionsRequired", check)
        assert result.verdict == "pass" and result.examples > 0, (check, result.reason)


@pytest.mark.parametrize("text", [
    "attn_mask = attention_mask.bool().unsqueeze(1)\n"
    "out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)",
    "m = attention_mask.to(torch.bool)\nout = F.scaled_dot_product_attention(q, k, v, attn_mask=m)",
])
def test_a_mask_turned_to_bool_is_drawn_as_bool_only(text: str) -> None:
    # kornia's SigLIP2: a float mask is 1/0 there; drawn as additive biases, -inf read as keep, 8 checks
    # failed falsely
    reading = read_mask((("its forward", text),), "attention_mask")
    assert reading.takes == frozenset({"bool"}) and reading.kind is None
    assert "a float one read as 1/0" in reading.how[0]


@pytest.mark.deep
def test_a_factory_returning_a_core_is_verified_inside_projections_with_what_the_core_declares() -> None:
    target = load_target(CORES + "sdpa_core")
    assert target.built_as.startswith(f"{CORES}sdpa_core -> SdpaCore inside projections the harness gives it")
    assert not target.build(8, 2).conventions.cross_attention  # declared on the core, kept by its wrapper
    for check in ("oracle_agreement", "head_split", "query_permutation"):
        result = run_property(all_properties()[check], target, settings=PROFILES["quick"], seed=0)
        assert result.verdict == "pass" and result.examples > 0, (check, result.reason)
    result = run_property(all_properties()["oracle_agreement"], load_target(CORES + "sdpa_core_last_key_dropped"),
                          settings=PROFILES["quick"], seed=0)
    assert result.verdict == "fail"
