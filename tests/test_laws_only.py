"""Layers taking a step the oracle does not model (a gate, talking heads, a relative-position table,
cosine-similarity scores, a residual) are verified by the laws alone: every check against the oracle is
n/a naming the step, the laws run with allowances measured against the layer's own float64 forward,
and a one-bug twin of each still fails the law its bug breaks."""

from __future__ import annotations

import math

import pytest
import torch

from mha_verify.properties.adapters.unmodelled import step_without_adapter
from mha_verify.properties.engine.measure import relation_allowed
from mha_verify.properties.engine.precision import read_precision
from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.strategies.examples import make_example
from mha_verify.properties.strategies.masks import MaskSpec
from mha_verify.properties.strategies.size_cases import Sizes
from mha_verify.properties.targets.eager import load_target
from tests.fixtures import odd_layers

QUICK = PROFILES["quick"]
LAWS = "tests/fixtures/laws_only_layers.py:"
SHAPE, SOURCE = "tests/fixtures/shape_read_layers.py:", "tests/fixtures/source_read_layers.py:"
ORACLE_CHECKS = ("oracle_agreement", "head_split", "grad_agreement", "fully_masked_rows")


def _run(spec: str, check: str) -> CheckResult:
    return run_property(all_properties()[check], load_target(spec), settings=QUICK, seed=0)


@pytest.mark.parametrize(("spec", "step", "positional"), [
    (SHAPE + "CrossPreNormed", "a normalization the oracle does not apply (norm: LayerNorm)",
     False),
    (SHAPE + "RelativeTable", "a relative-position table (rel_pos_emb.weight (33, 4))", True),
    (SHAPE + "TalkingHeads", "mixing across heads (talking heads: mix_heads_pre_attn (2, 2))",
     False),
    (SHAPE + "XLBiases", "Transformer-XL's per-head content/position biases (u (2, 4))",
     True),
    ("tests/fixtures/scored_layers.py:QueryAndGate",
     "an output gate from its query projection (16 features, where its output projection takes 8)", False),
    (SOURCE + "WithBiasKV",
     "a learned key and value appended to every sequence (bias_k, bias_v (1, 1, 8))", False),
    (SOURCE + "Gated", "a gate (to_gate: Linear)", False),
    (SOURCE + "WithResidual", "its input added back to its output (a residual: `x_res = x`)",
     False),
    (LAWS + "CosineSim", "a scoring of its own (its forward computes cosine-similarity attention", False),
    # its per-head gains q_scale, k_scale are parameters no step names: held as if positional (permutations n/a)
    (LAWS + "NormalizedCosine", "a scoring of its own (its forward computes cosine-similarity attention", True),
    (SHAPE + "CosineSim", "a scoring of its own (its forward computes cosine-similarity attention", False),
    (SHAPE + "LinearKernel", "a scoring of its own (its forward computes linear attention", False),
    ("tests/fixtures/kv_layers.py:LearnedQueryScale", "a learned scale of its queries (scaling)", False),
    (LAWS + "GatedMasked", "a gate (to_gates: Linear)", False),
])
def test_a_step_beyond_the_oracle_is_named_and_the_oracle_checks_are_n_a(spec: str, step: str,
                                                                        positional: bool) -> None:
    conv = load_target(spec).build(8, 2).conventions
    assert conv.beyond is not None and conv.beyond.startswith(step), conv.beyond
    assert conv.beyond_positional is positional
    assert f"laws only: it takes {step}" in conv.describe()
    result = _run(spec, "oracle_agreement")
    assert (result.verdict, result.kind) == ("n/a", "beyond"), result
    assert result.reason is not None and step in result.reason and "checks against the oracle are n/a" in result.reason


@pytest.mark.deep
def test_every_check_against_the_oracle_is_n_a_and_the_laws_run() -> None:
    results = {c: _run(LAWS + "GatedMasked", c) for c in (*ORACLE_CHECKS, "masked_kv_invariance",
                                                          "batch_independence", "query_permutation", "gradcheck")}
    for name in ORACLE_CHECKS:
        assert (results[name].verdict, results[name].kind) == ("n/a", "beyond"), results[name]
    for name in ("masked_kv_invariance", "batch_independence", "query_permutation", "gradcheck"):
        assert results[name].verdict == "pass" and results[name].examples >= 5, results[name]


def test_a_positional_step_leaves_the_permutation_laws_n_a_naming_it() -> None:
    result = _run(SHAPE + "RelativeTable", "query_permutation")
    assert (result.verdict, result.kind) == ("n/a", "beyond"), result
    assert "depends on positions" in str(result.reason)


@pytest.mark.deep
@pytest.mark.parametrize(("correct", "twin", "laws"), [
    ("GatedMasked", "GatedMaskedPooled", ("masked_kv_invariance",)),
    ("RelativeCausal", "RelativeCausalLeak", ("no_future_leak", "prefix_consistency")),
    ("CosineSim", "CosineSimBatchNorm", ("batch_independence",)),
    ("NormalizedCosine", "NormalizedCosineBatchNorm", ("batch_independence",)),
])
def test_each_correct_layer_keeps_the_laws_and_its_twin_breaks_one(correct: str, twin: str,
                                                                   laws: tuple[str, ...]) -> None:
    for law in laws:
        good = _run(LAWS + correct, law)
        assert good.verdict == "pass" and good.examples >= 5, good
        bad = _run(LAWS + twin, law)
        assert bad.verdict == "fail", bad


def test_the_relation_allowance_is_measured_against_the_layers_own_float64_forward() -> None:
    bound = load_target(LAWS + "GatedMasked").build(8, 2, seed=3)
    ex = make_example(Sizes(2, 5, 5, 8, 2), MaskSpec("padding", "B11L", "bool", 0), (1.0, 1.0), 3)
    ex = ex._replace(k=ex.q, v=ex.q)
    allowed = relation_allowed(bound, ex)
    assert math.isfinite(allowed) and 0.0 < allowed < 1e-3, allowed
    wide = bound.in_float64()
    assert all(p.dtype == torch.float64 for p in wide.module.parameters())
    assert all(p.dtype == torch.float32 for p in bound.module.parameters())  # the layer itself untouched


def test_a_float64_forward_through_float32_is_a_policy_without_the_oracle() -> None:
    reading = read_precision(load_target(LAWS + "GatedMaskedUpcast"))
    assert reading.laws_only and reading.policy and reading.dtype == "float32"
    assert "laws only: its output is not held against the oracle" in reading.finding()
    assert not read_precision(load_target(LAWS + "GatedMasked")).policy


@pytest.mark.parametrize(("spec", "said"), [
    ("tests/fixtures/feature_map_layers.py:ConvProjectedWide", "q, k, v projected by convolutions over a feature map"),
    ("tests/fixtures/odd_layers.py:AutoCorrelation", "computes through torch.fft"),
    (SOURCE + "ProjectionOnly", "computes no attention weights in its forward"),
])
def test_steps_under_which_the_laws_do_not_hold_are_still_refused(spec: str, said: str) -> None:
    with pytest.raises(TargetError, match=said):
        load_target(spec).build(8, 2).conventions  # noqa: B018 (read for the refusal)


@pytest.mark.deep
def test_a_grid_layout_read_at_one_size_holds_where_no_probe_can_read_it() -> None:
    # at C = 1 its LayerNorm gives its bias whatever the input: nothing moves, and the probe alone would
    # call it batch-first on a 3-D input it asserts against (vit-pytorch's relative-bias layer failed so)
    target = load_target(LAWS + "FeatureMapNormed")
    assert target.build(1, 1).conventions.layout == target.build(8, 2).conventions.layout == "B1LD"
    for law in ("batch_independence", "determinism"):
        result = run_property(all_properties()[law], target, settings=QUICK, seed=0)
        assert result.verdict == "pass" and result.examples >= 5, result


def test_a_convolution_over_positions_is_refused_by_name() -> None:
    with pytest.raises(TargetError, match=r"ShortConvolved takes a convolution over positions \(conv1d: Conv1d\)"):
        load_target(LAWS + "ShortConvolved").build(8, 2).conventions  # noqa: B018 (read for the refusal)


@pytest.mark.deep
def test_mask_forms_the_layer_raises_on_as_read_are_not_drawn_and_said() -> None:
    target = load_target(LAWS + "TokenMasked")
    assert target.mask_refused is not None
    kinds, forms, error = target.mask_refused
    assert (kinds, forms) == ({"bool", "float"}, {"B11L"}) and error.startswith("bool B1LL: RuntimeError"), \
        target.mask_refused
    conv = target.build(8, 2).conventions
    assert conv.mask == {"bool", "float"} and conv.mask_forms == {"B11L"}
    assert "masks drawn as bool/float B11L only" in conv.describe()
    for law in ("masked_kv_invariance", "batch_independence"):
        result = _run(LAWS + "TokenMasked", law)
        assert result.verdict == "pass" and result.examples >= 5, result


def test_a_layer_raising_on_every_mask_form_is_called_without_one() -> None:
    conv = load_target(LAWS + "EveryMaskRaises").build(8, 2).conventions
    assert not conv.mask and conv.mask_unsupported is not None and "called without one" in conv.mask_unsupported


def test_a_rotary_of_its_own_is_drawn_at_even_head_widths_only() -> None:
    conv = load_target(LAWS + "OwnRotary").build(8, 2).conventions
    assert conv.beyond_positional and conv.head_dim_multiple == 2 and "head widths a multiple of 2" in conv.describe()
    result = _run(LAWS + "OwnRotary", "batch_independence")
    assert result.verdict == "pass" and result.examples >= 5, result


@pytest.mark.deep
def test_a_scoring_behind_a_branch_this_instance_skips_is_not_read_as_its_own() -> None:
    # open_clip's: cosine attention under ``if self.logit_scale is not None:``, None as built by default
    conv = load_target(LAWS + "CosineOptIn").build(8, 2).conventions
    assert conv.beyond is None
    assert _run(LAWS + "CosineOptIn", "oracle_agreement").verdict == "pass"
    assert _run(LAWS + "CosineOptInKeysValuesSwapped", "oracle_agreement").verdict == "fail"
    on = load_target(LAWS + "cosine_opt_in_on").build(8, 2).conventions
    assert on.beyond is not None and "cosine-similarity attention" in on.beyond


def test_transformer_xl_biases_are_named_where_no_adapter_reads_the_layer() -> None:
    # speechbrain's RelPosMHAXL was "no adapter recognizes" with its children listed, the biases unsaid
    said = step_without_adapter(odd_layers.RelPosXL(8, 2), ())
    assert said is not None and said.startswith(
        "takes Transformer-XL's per-head content/position biases (pos_bias_u, pos_bias_v), a step beyond")
