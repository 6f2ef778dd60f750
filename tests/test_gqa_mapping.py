"""Grouped-query attention: which query heads share a key/value head (``kv_map``), declared or read from
the layer's forward, applied by the oracle; held against SDPA's own ``enable_gqa`` (interleave) and the
layers of tests/fixtures/gqa_layers.py with their one-bug twins."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mha_verify.mha.reference import MHAParams, multi_head, per_head
from mha_verify.mha.scoring import Scoring
from mha_verify.properties.protocol import Conventions
from mha_verify.properties.targets.eager import load_target
from tests.cli_run import run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = "tests/fixtures/gqa_layers.py:"


def _params(d: int, n_kv: int, hd: int, seed: int = 0) -> MHAParams:
    gen = torch.Generator().manual_seed(seed)

    def w(rows: int) -> torch.Tensor:
        return torch.randn(rows, d, generator=gen, dtype=torch.float64) / d ** 0.5

    return MHAParams(w(d), None, w(n_kv * hd), None, w(n_kv * hd), None, w(d), None)


def test_interleave_is_sdpas_enable_gqa_and_tile_is_repeat() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 5, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 7, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    inter, tile = Scoring(), Scoring(kv_map="tile")
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, inter.repeat_kv(k, 6), inter.repeat_kv(v, 6)),
                               expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(tile.repeat_kv(k, 6), k.repeat(1, 2, 1, 1))
    assert [inter.kv_head(i, 6, 3) for i in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [tile.kv_head(i, 6, 3) for i in range(6)] == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("kv_map", ["interleave", "tile"])
def test_folding_is_the_transpose_of_repeating(kv_map: str) -> None:
    s = Scoring(kv_map=kv_map)
    gen = torch.Generator().manual_seed(2)
    y, x = torch.randn(2, 2, 3, 5, generator=gen, dtype=torch.float64), torch.randn(2, 6, 3, 5, generator=gen,
                                                                                    dtype=torch.float64)
    assert abs(float((s.repeat_kv(y, 6) * x).sum() - (y * s.fold_kv(x, 2)).sum())) < 1e-12


@pytest.mark.parametrize("kv_map", ["interleave", "tile"])
def test_the_per_head_formulation_follows_the_mapping(kv_map: str) -> None:
    p, s = _params(12, 2, 3), Scoring(kv_map=kv_map)
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 4, 12, generator=gen, dtype=torch.float64), torch.randn(2, 5, 12, generator=gen,
                                                                                  dtype=torch.float64)
    packed, _ = multi_head(q, k, k, p, 4, scoring=s)
    torch.testing.assert_close(per_head(q, k, k, p, 4, scoring=s), packed, rtol=1e-12, atol=1e-12)
    other, _ = multi_head(q, k, k, p, 4, scoring=Scoring(kv_map="interleave" if kv_map == "tile" else "tile"))
    assert float((other - packed).abs().max()) > 1e-3  # the two mappings differ with H = 4, Hkv = 2


def test_the_mapping_is_declared_by_name() -> None:
    assert Conventions().kv_map == "interleave"
    assert Conventions().declare({"kv_map": "tile"}).kv_map == "tile"
    assert "grouped-query heads mapped by tile" in Conventions(kv_map="tile").describe()
    with pytest.raises(ValueError, match=r"kv_map='repeat'.*interleave"):
        Conventions().declare({"kv_map": "repeat"})


@pytest.mark.parametrize(("layer", "kv_map", "note"), [
    ("Interleaved", "interleave", "interleaved (its forward)"),
    ("Tiled", "tile", "tiled (its forward)"),
    ("TilesDeclaredInterleave", "interleave", "tiled (its forward)"),  # read, then the declaration wins
    ("InterleavesDeclaredTile", "tile", None),
])
def test_the_mapping_is_read_from_the_forward_and_a_declaration_wins(layer: str, kv_map: str,
                                                                     note: str | None) -> None:
    bound = load_target(FIXTURE + layer).build(16, 4)
    assert bound.conventions.kv_map == kv_map
    assert bound.params().w_k.shape == (8, 16)  # 2 kv heads of 4, read from k_proj
    if note:
        assert any(note in n for n in bound.conventions.notes), bound.conventions.notes


def test_an_hf_layer_is_read_as_repeat_kv_interleaves() -> None:
    pytest.importorskip("transformers")
    bound = load_target("transformers.models.llama.modeling_llama:LlamaAttention").build(32, 4)
    assert bound.params().w_k.shape[0] < 32 and bound.conventions.kv_map == "interleave"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check", "--no-export", "--profile", "ci", "--max-examples", "25", *args)


@pytest.mark.deep
@pytest.mark.parametrize("layer", ["Interleaved", "Tiled"])
def test_a_layer_of_either_mapping_passes_the_gate(layer: str) -> None:
    run = cli("--target", FIXTURE + layer)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " 0 failed" in run.stdout


@pytest.mark.deep
@pytest.mark.parametrize("layer", ["TilesDeclaredInterleave", "InterleavesDeclaredTile"])
def test_a_twin_of_the_other_mapping_fails(layer: str) -> None:
    run = cli("--target", FIXTURE + layer, "--only", "oracle_agreement,grad_agreement")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "FAILED properties/oracle_agreement" in run.stdout and "FAILED properties/grad_agreement" in run.stdout
