"""Decode consistency: prefill and decode steps through a layer's own KV cache against its forward over
all positions, on HF's own layers with their ``Cache`` (zero user code) and on the layers of
tests/fixtures/cached_layers.py with their one-bug twins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mha_verify.properties.adapters.kv_cache import KVCache, cache_argument, new_cache
from mha_verify.properties.engine.measure import Violation
from mha_verify.properties.invariants.decode import chunks_of, decode_consistency, schedules
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.strategies.examples import make_example
from mha_verify.properties.strategies.masks import MaskSpec
from mha_verify.properties.strategies.size_cases import Sizes
from mha_verify.properties.targets.eager import load_target
from tests.cli_run import run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = "tests/fixtures/cached_layers.py:"
NO_MASK = MaskSpec("none", "BHLL", "bool", 0)


def _example(batch: int, length: int, d: int, h: int, seed: int = 0):  # type: ignore[no-untyped-def]
    ex = make_example(Sizes(batch, length, length, d, h), NO_MASK, (1.0,) * batch, seed)
    return ex._replace(k=ex.q, v=ex.q)  # self-attention: one sequence


def test_chunks_cover_the_sequence_and_bad_schedules_are_named() -> None:
    assert chunks_of(7, 4, 1) == (4, 1, 1, 1)
    assert chunks_of(8, 1, 3) == (1, 3, 3, 1)
    assert chunks_of(3, 3, 1) == (3,)
    assert [c for _, c in schedules(5)] == [(3, 1, 1), (1, 3, 1)]
    with pytest.raises(ValueError, match="prefill=0"):
        chunks_of(4, 0, 1)


def test_the_cache_argument_is_read_with_the_layer_index() -> None:
    bound = load_target(FIXTURE + "CachedAttention").build(16, 4)
    assert cache_argument(bound.module) == "cache" and bound.conventions.kv_cache == "hf_cache"
    bound.module.layer_idx = None
    assert cache_argument(bound.module) is None  # a Cache is indexed by layer: none to drive
    plain = load_target("tests/fixtures/causal_align.py:BottomRight").build(16, 4)
    assert plain.conventions.kv_cache is None
    assert "no KV cache" in all_properties()["decode_consistency"].strategy(plain.conventions)  # type: ignore[operator]


@pytest.mark.parametrize("layer", ["CachedAttention", "CacheOffsetByOne", "ChunkTopLeft"])
def test_a_forward_without_a_cache_is_the_same_for_the_twins(layer: str) -> None:
    """The twins differ only where a cache holds keys: no check of a plain forward could see them."""
    ex = _example(2, 5, 16, 4)
    ours = load_target(FIXTURE + "CachedAttention").build(16, 4, seed=3)
    twin = load_target(FIXTURE + layer).build(16, 4, seed=3)
    torch.testing.assert_close(twin(ex.q, ex.q, ex.q), ours(ex.q, ex.q, ex.q), rtol=0, atol=0)


def test_the_correct_layer_decodes_as_its_forward() -> None:
    bound = load_target(FIXTURE + "CachedAttention").build(32, 4)
    measure = decode_consistency(bound, _example(2, 17, 32, 4))  # past the 16 boundary, decode steps of one
    assert measure.checked and measure.error <= measure.allowed


@pytest.mark.parametrize(("layer", "message"), [
    ("CacheOffsetByOne", r"prefill then decode steps \[9, 1, .*\]: position 9 \(chunk 2: Lq=1 against Lk=10 keys, "
                         r"9 of them cached\)"),
    ("ChunkTopLeft", r"chunks of 3 \[1, 3, .*\]: position 1 \(chunk 2: Lq=3 against Lk=4 keys, 1 of them cached\)"),
])
def test_each_twin_fails_at_its_first_cached_position(layer: str, message: str) -> None:
    bound = load_target(FIXTURE + layer).build(32, 4)
    with pytest.raises(Violation, match=message):
        decode_consistency(bound, _example(2, 17, 32, 4))


@pytest.mark.parametrize("layer", ["CachedAttention", "CacheOffsetByOne"])
def test_without_transformers_the_harness_cache_drives_the_layer(layer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    assert isinstance(new_cache(), KVCache)
    bound = load_target(FIXTURE + layer).build(32, 4)
    if layer == "CachedAttention":
        measure = decode_consistency(bound, _example(2, 17, 32, 4))
        assert measure.checked and measure.error <= measure.allowed
    else:
        with pytest.raises(Violation, match=r"position 9 \(chunk 2: Lq=1 against Lk=10 keys"):
            decode_consistency(bound, _example(2, 17, 32, 4))


def test_the_harness_cache_holds_what_transformers_dynamic_cache_holds() -> None:
    transformers = pytest.importorskip("transformers")
    ours, theirs = KVCache(), transformers.DynamicCache()
    gen = torch.Generator().manual_seed(0)
    for length in (3, 1, 2):
        k, v = (torch.randn(2, 4, length, 8, generator=gen) for _ in range(2))
        for layer_idx in (0, 1):
            for a, b in zip(ours.update(k, v, layer_idx), theirs.update(k, v, layer_idx), strict=True):
                assert torch.equal(a, b)
            assert ours.get_seq_length(layer_idx) == theirs.get_seq_length(layer_idx)
    assert ours.get_seq_length(5) == 0


@pytest.mark.parametrize("spec", ["transformers.models.llama.modeling_llama:LlamaAttention",
                                  "transformers.models.qwen2.modeling_qwen2:Qwen2Attention"])
def test_hf_layers_decode_through_their_own_cache_with_no_user_code(spec: str) -> None:
    pytest.importorskip("transformers")
    bound = load_target(spec).build(64, 4)  # grouped-query: 2 kv heads of 16
    assert bound.conventions.kv_cache == "hf_cache" and bound.params().w_k.shape[0] < 64
    measure = decode_consistency(bound, _example(2, 33, 64, 4, seed=1))
    assert measure.checked and measure.error <= measure.allowed


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check", "--no-export", "--profile", "ci", "--max-examples", "25", *args)


@pytest.mark.deep
def test_the_correct_layer_passes_the_whole_gate() -> None:
    run = cli("--target", FIXTURE + "CachedAttention")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " 0 failed" in run.stdout and "decode_consistency" in run.stdout


@pytest.mark.deep
@pytest.mark.parametrize(("layer", "example"), [
    ("CacheOffsetByOne", "B=1 Lq=2 Lk=2"),  # shrunk: a prefill of one position and one decode step
    ("ChunkTopLeft", "B=1 Lq=3 Lk=3"),  # shrunk: one position, then a chunk of two
])
def test_each_twin_fails_the_gate_on_decode_consistency_alone(layer: str, example: str) -> None:
    run = cli("--target", FIXTURE + layer)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "FAILED properties/decode_consistency" in run.stdout and " 1 failed" in run.stdout
    assert f"example: {example} " in run.stdout
