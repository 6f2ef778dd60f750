"""A model exported with static axes is judged at its sizes: the examples use the fixed batch and
lengths, calls it cannot take (one item alone, a prefix) are unchecked with the reason, and the
frozen axis is one finding of the interface check (a warning for `validate`, a failure for our
own exports and under `validate --require-dynamic`), never a failure of every property."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from mha_verify.properties.engine import profiles
from mha_verify.properties.onnx.interface import read_interface
from mha_verify.properties.strategies.size_cases import sizes
from mha_verify.properties.targets.eager import load_target
from mha_verify.validation import interface_result, validate_model

QUICK = profiles.PROFILES["quick"]


def _export(path: Path, dynamic: dict[str, dict[int, str]] | None) -> Path:
    module = load_target().build(16, 4, seed=0)
    q, k = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.module, (q, k, k), str(path), input_names=["q", "k", "v"],  # type: ignore[attr-defined]
                          output_names=["out"], dynamo=False, dynamic_axes=dynamic)
    return path


@given(sizes(axes=(2, None, 7)))
@settings(max_examples=20, deadline=None)
def test_sizes_pin_the_fixed_axes(s: object) -> None:
    assert s.batch == 2 and s.lk == 7  # type: ignore[attr-defined]


def test_a_static_batch_model_is_judged_at_its_batch(tmp_path: Path) -> None:
    path = _export(tmp_path / "b2.onnx", {"q": {1: "lq"}, "k": {1: "lk"}, "v": {1: "lk"}, "out": {1: "lq"}})
    info = read_interface(path)
    assert info.fixed_axes == (2, None, None)
    assert interface_result(info, "b2", frozen="warn").verdict == "warn"
    own = interface_result(info, "b2")
    assert own.failed and "B is fixed to 2" in (own.reason or "")
    results = validate_model(path, settings=QUICK, opt_levels=("opt-all",),
                             checks=("oracle_agreement", "batch_independence"))
    by_check = {r.name.rsplit("/", 1)[-1]: r for r in results[1:]}
    assert by_check["oracle_agreement"].verdict == "pass" and by_check["oracle_agreement"].examples > 0
    one_item = by_check["batch_independence"]
    assert one_item.verdict == "warn" and "the model fixes B to 2" in (one_item.reason or ""), one_item


@pytest.mark.integration
@pytest.mark.parametrize("flag", [[], ["--require-dynamic"]])
def test_validate_warns_on_a_frozen_axis_unless_asked_to_fail(tmp_path: Path, flag: list[str]) -> None:
    import subprocess
    import sys

    path = _export(tmp_path / "static.onnx", None)
    proc = subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(path), "--no-isolation",
                           "--profile", "quick", *flag], capture_output=True, text=True, timeout=600)
    assert proc.returncode == (1 if flag else 0), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "B is fixed to 2" in proc.stdout
