"""Layers that take a 4-D input (tests/fixtures/grid_layers.py) are read by a probe, not by their names:
the axis they attend along takes the sequence, a batch-like one the batch, the third is 1; each correct
layer then passes the oracle with no user code and its one-bug twin fails. A forward's required arguments
that no role names are given None, and the conventions say so."""

from __future__ import annotations

import pytest
import torch

from mha_verify.properties.adapters.layout_probe import from_layer, to_layer
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import GRID_LAYOUTS, Conventions, TargetError
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/grid_layers.py:"


def _verdict(name: str, check: str = "oracle_agreement") -> str:
    return run_property(all_properties()[check], load_target(FIXTURE + name), settings=PROFILES["quick"],
                        seed=0).verdict


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "layout", "twin"), [("FeatureMap", "B1LD", "FeatureMapNoTranspose"),
                                                       ("TiedRows", "1LBD", "TiedRowsKeysFromValues"),
                                                       ("Patches", "B1LD", "PatchesSoftmaxOverQueries")])
def test_a_4d_layer_is_read_by_its_attended_axis_and_its_twin_fails(layer: str, layout: str, twin: str) -> None:
    conventions = load_target(FIXTURE + layer).build(8, 2).conventions
    assert conventions.layout == layout
    assert f"4-D inputs ({', '.join(layout)}): a sequence as one row, read by a probe" in "; ".join(conventions.notes)
    for check in ("oracle_agreement", "batch_independence", "query_permutation"):
        assert _verdict(layer, check) == "pass", check
    assert _verdict(twin) == "fail"


@pytest.mark.deep
def test_a_required_argument_with_no_role_is_given_none_and_said() -> None:
    notes = "; ".join(load_target(FIXTURE + "RequiredNone").build(8, 2).conventions.notes)
    assert "forward's rotary, pos, dense_mask (required, no role the harness reads) given None" in notes
    assert _verdict("RequiredNone") == "pass"
    assert _verdict("RequiredNoneScaledByWidth") == "fail"


@pytest.mark.parametrize("layout", GRID_LAYOUTS)
def test_a_sequence_goes_into_a_grid_layout_and_back_unchanged(layout: str) -> None:
    x = torch.randn(2, 3, 4)
    inside = to_layer(x, layout)
    assert inside.shape == tuple({"B": 2, "L": 3, "1": 1, "D": 4}[axis] for axis in layout)
    assert torch.equal(from_layer(inside, layout), x)
    assert Conventions().declare({"layout": layout}).layout == layout


def test_a_layer_of_no_4d_input_keeps_the_default_layout() -> None:
    # torch's MHA takes (B, L, D) as given: no grid probe runs where the 3-D call works
    from mha_verify.properties.adapters.layout_probe import read_layout

    module = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    assert read_layout(module, lambda x: module(x, x, x)[0], 8, torch.float32)[0] == "batch_first"


def test_a_call_that_fails_on_a_none_given_says_so_and_a_tensor_argument_is_never_given_none() -> None:
    with pytest.raises(TargetError, match=r"no mask \(forward's table \(required, no role the harness reads\) "
                                          r"given None\), raised TypeError"):
        load_target(FIXTURE + "RequiredTable")
    with pytest.raises(TargetError, match=r"raised TypeError: TwoInputs.forward\(\) missing 1 required positional "
                                          r"argument: 'h'"):
        load_target(FIXTURE + "TwoInputs")
