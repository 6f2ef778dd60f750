"""denoising-diffusion-pytorch's linear attention (tests/fixtures/normed_linear_layers.py): keys contracted
with the values over positions written positions-last (``'b h d n, b h e n -> b h d e'``) are read as linear
attention, an output block ending in a norm gives its projection's weights and names the norm, and memory
keys and values (``mem_kv``) are a step that permuting positions commutes with: the layer is held by the
laws, the permutation laws included, and a twin that scrambles positions in its head merge fails them. An
input norm the oracle could not place is one more step of such a layer, not a reason to refuse it."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/normed_linear_layers.py:"


def _verdicts(name: str, checks: tuple[str, ...]) -> dict[str, str]:
    target = load_target(FIXTURE + name)
    return {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0).verdict for c in checks}


@pytest.mark.deep
def test_linear_attention_with_a_normed_output_block_is_read_and_held_by_the_laws() -> None:
    conv = load_target(FIXTURE + "NormedLinearAttention").build(8, 2).conventions
    assert conv.layout == "BDL" and not conv.beyond_positional
    assert conv.beyond is not None
    assert "computes linear attention" in conv.beyond
    assert "a learned key and value appended to every sequence (mem_kv (2, 2, 4, 4))" in conv.beyond
    assert "a normalization the oracle does not apply (to_out.1: RMSNorm)" in conv.beyond
    checks = ("query_permutation", "batch_independence", "gradcheck", "oracle_agreement")
    assert _verdicts("NormedLinearAttention", checks) == {
        "query_permutation": "pass", "batch_independence": "pass", "gradcheck": "pass", "oracle_agreement": "n/a"}


@pytest.mark.deep
def test_a_twin_scrambling_positions_in_its_head_merge_fails_the_permutation_law() -> None:
    assert _verdicts("NormedLinearAttentionScrambled", ("query_permutation",)) == {"query_permutation": "fail"}


@pytest.mark.deep
def test_an_input_norm_the_oracle_cannot_place_is_a_step_of_a_layer_held_by_the_laws_anyway() -> None:
    # simple-diffusion's RMSNorm over channels: before, the build was refused ("computes neither RMSNorm,
    # LayerNorm nor an L2 norm ... a QK-norm the oracle does not model"), though no check needs the oracle
    conv = load_target(FIXTURE + "ChannelNormedLinearAttention").build(8, 2).conventions
    assert conv.input_norm is None and conv.beyond is not None
    assert "a normalization the oracle does not apply (norm: ChannelNorm)" in conv.beyond
    assert _verdicts("ChannelNormedLinearAttention", ("query_permutation", "batch_independence")) == {
        "query_permutation": "pass", "batch_independence": "pass"}
