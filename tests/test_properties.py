"""The property suite: the reference passes every property; verdicts for foreign targets."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

PROPS = all_properties()
SETTINGS = profiles.PROFILES[profiles.profile_name()]


# properties of a convention the reference does not have (tests/test_scoring.py and
# tests/test_decode_consistency.py run them on layers that do)
OF_OTHER_CONVENTIONS = {
    "window_locality": "no sliding window declared or read",
    "decode_consistency": "takes no KV cache",
    "eager_vs_sdpa": "runs it through one attention implementation",
}


@pytest.mark.parametrize("name", [n for n in PROPS if n not in OF_OTHER_CONVENTIONS])
def test_reference_passes(name: str) -> None:
    result = run_property(PROPS[name], load_target(), settings=SETTINGS)
    assert result.verdict == "pass", f"{result}\n{result.counterexample}"
    assert result.examples > 0


@pytest.mark.parametrize("name", list(OF_OTHER_CONVENTIONS))
def test_reference_is_na_for_conventions_it_does_not_have(name: str) -> None:
    result = run_property(PROPS[name], load_target(), settings=SETTINGS)
    assert result.verdict == "n/a" and OF_OTHER_CONVENTIONS[name] in str(result.reason), result


SEEDS = "tests/fixtures/seed_{}.py:{}"


@pytest.mark.serial
@pytest.mark.deep
@pytest.mark.parametrize(
    ("spec", "name", "verdict"),
    [
        pytest.param(SEEDS.format("000", "MultiHeadAttention"), "fully_masked_rows", "fail", id="seed000-nan-rows"),
        pytest.param(SEEDS.format("000", "MultiHeadAttention"), "oracle_agreement", "fail", id="seed000-oracle"),
        pytest.param(SEEDS.format("000", "MultiHeadAttention"), "lk_equals_lv", "pass", id="seed000-lk-lv"),
        pytest.param(SEEDS.format("000", "MultiHeadAttention"), "mask_zeroes_weights", "n/a", id="seed000-no-w"),
        pytest.param(SEEDS.format("001", "MultiHeadAttention"), "oracle_agreement", "pass", id="seed001-oracle"),
        pytest.param(SEEDS.format("001", "MultiHeadAttention"), "head_split", "pass", id="seed001-head-split"),
        pytest.param(SEEDS.format("001", "MultiHeadAttention"), "masked_kv_invariance", "n/a", id="seed001-no-mask"),
        pytest.param(SEEDS.format("001", "MultiHeadAttention"), "key_permutation", "n/a", id="seed001-self-only"),
        pytest.param(SEEDS.format("002", "build"), "oracle_agreement", "fail", id="seed002-oracle"),
        pytest.param(SEEDS.format("002", "build"), "head_split", "fail", id="seed002-head-split"),
        pytest.param("torch.nn:MultiheadAttention", "oracle_agreement", "pass", id="torch-oracle"),
        pytest.param("torch.nn:MultiheadAttention", "fully_masked_rows", "warn", id="torch-nan-declared"),
        pytest.param("torch.nn:MultiheadAttention", "lk_equals_lv", "pass", id="torch-lk-lv"),
        pytest.param("torch.nn:MultiheadAttention", "mask_zeroes_weights", "pass", id="torch-mask-weights"),
    ],
)
def test_foreign_target_verdicts(spec: str, name: str, verdict: str) -> None:
    result = run_property(PROPS[name], load_target(spec), settings=SETTINGS)
    assert result.verdict == verdict, f"{result}\n{result.counterexample}"
    if verdict == "fail":
        assert result.counterexample, "a failure must carry its shrunk counterexample"
    if verdict in ("n/a", "warn"):
        assert result.reason
