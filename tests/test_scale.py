"""The softmax scale as a convention: declared on a layer (``mha_verify_conventions``), read from an
ONNX ``Attention``'s ``scale`` attribute or declared with ``validate --conventions scale=X``, and
applied by the oracle. A layer that scales otherwise than it declares fails ``oracle_agreement``."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.onnx.interface import read_interface
from mha_verify.properties.protocol import Conventions
from mha_verify.properties.targets.eager import load_target
from mha_verify.validation import validate_model

FIXTURE = "tests/fixtures/sdpa_layers.py:"
QUICK = profiles.PROFILES["quick"]


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "verdict"), [("UnscaledDeclared", "pass"), ("Unscaled", "fail"),
                                                ("DeclaresOneButScalesByRootHd", "fail")])
def test_the_oracle_applies_the_declared_scale(layer: str, verdict: str) -> None:
    result = run_property(all_properties()["oracle_agreement"], load_target(FIXTURE + layer), settings=QUICK, seed=0)
    assert result.verdict == verdict, result
    assert result.examples > 0


def test_scale_is_a_checked_declaration() -> None:
    assert Conventions().declare({"scale": 1}).scale == 1.0
    for bad in (0, -1.0, float("nan"), "1", True):
        with pytest.raises(ValueError, match="scale"):
            Conventions().declare({"scale": bad})


def _attention(path: Path, scale: float) -> Path:
    ins = [oh.make_tensor_value_info(n, TensorProto.FLOAT, ["b", length, 16]) for n, length in
           (("q", "lq"), ("k", "lk"), ("v", "lk"))]
    node = oh.make_node("Attention", ["q", "k", "v"], ["out"], q_num_heads=4, kv_num_heads=4, scale=scale)
    out = oh.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "lq", 16])
    onnx.save(oh.make_model(oh.make_graph([node], "a", ins, [out]), opset_imports=[oh.make_opsetid("", 23)]),
              str(path))
    return path


def test_an_attention_operators_scale_is_read_and_a_wrong_declaration_fails(tmp_path: Path) -> None:
    path = _attention(tmp_path / "s.onnx", 1.0)
    info = read_interface(path)
    assert info.conventions["scale"] == ("1.0", "the attention operator")
    read = validate_model(path, settings=QUICK, opt_levels=("opt-all",), checks=("oracle_agreement",))
    assert read[1].verdict == "pass" and read[1].examples > 0, read[1]
    wrong = validate_model(path, settings=QUICK, opt_levels=("opt-all",), checks=("oracle_agreement",),
                           declared={"scale": "0.5"})
    assert wrong[1].failed, wrong[1]
