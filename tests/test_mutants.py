"""Bug-finding power: each one-bug mutant of the reference is caught by the expected property
through a genuine violation (not an exception inside the harness), the unmutated base passes
the same properties, and the boundary mutants are exact below their block size."""

from __future__ import annotations

import math

import pytest
import torch

from mha_verify.mha.reference import multi_head
from mha_verify.properties.adapters.registry import find_adapter
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import Target
from tests.mutants import BOUNDARY_MUTANTS, CATALOG, _Explicit

# the mutant catalog, one gate run per mutant (tox -e deep); its checks reach D = 1024 (head_split on a mutant
# peaks near 10 GB), so its tests are serial: run one at a time
pytestmark = pytest.mark.deep

SETTINGS = profiles.PROFILES[profiles.profile_name()]


@pytest.mark.serial
@pytest.mark.parametrize("mutant", list(CATALOG))
def test_mutant_is_caught(mutant: str) -> None:
    cls, expected = CATALOG[mutant]
    target = Target(f"tests.mutants:{cls.__name__}", cls)
    result = run_property(all_properties()[expected], target, settings=SETTINGS)
    assert result.verdict == "fail", f"{mutant} escaped {expected}: {result}"
    assert result.counterexample and result.reason
    # a genuine violation: the property measured an error beyond its tolerance, or the target
    # itself misbehaved (NaN, no exception where one is due) -- never a crash in the harness
    assert not result.reason.startswith("the target raised"), result.reason
    assert result.worst_error is not None and result.allowed is not None
    assert result.worst_error > result.allowed or math.isinf(result.worst_error), result


BASE_PROPERTIES = sorted({expected for _, expected in CATALOG.values()})


@pytest.mark.serial
@pytest.mark.parametrize("name", BASE_PROPERTIES)
def test_unmutated_base_passes(name: str) -> None:
    """The explicit-formula base of the mutants passes every property that catches a mutant."""
    result = run_property(all_properties()[name], Target("tests.mutants:_Explicit", _Explicit), settings=SETTINGS)
    assert result.verdict in ("pass", "n/a"), str(result)
    if result.verdict == "pass":
        assert result.examples >= 1


def _inputs(batch: int, lq: int, lk: int, d_model: int, n_head: int, seed: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, lq, d_model, generator=gen)
    k = torch.randn(batch, lk, d_model, generator=gen)
    v = torch.randn(batch, lk, d_model, generator=gen)
    mask = torch.rand(batch, 1, lq, lk, generator=gen) < 0.7
    mask[..., 0] = True
    return q, k, v, mask


def _error(cls: type, batch: int, lq: int, lk: int, head_dim: int, n_head: int) -> float:
    torch.manual_seed(0)
    module = cls(n_head * head_dim, n_head, 0.0).eval()
    q, k, v, mask = _inputs(batch, lq, lk, n_head * head_dim, n_head)
    ref, _ = multi_head(q, k, v, find_adapter(module).params(module), n_head, mask)
    with torch.no_grad():
        out = module(q, k, v, mask)
    return float((out.double() - ref).abs().max() / ref.abs().max())


SMALL = {"batch": 2, "lq": 5, "lk": 7, "head_dim": 8, "n_head": 2}


@pytest.mark.serial
@pytest.mark.parametrize("mutant", list(BOUNDARY_MUTANTS))
def test_boundary_mutant_is_exact_below_its_block_and_wrong_past_it(mutant: str) -> None:
    cls, boundary = BOUNDARY_MUTANTS[mutant]
    (axis, block), = boundary.items()
    at = dict(SMALL, **{axis: block})
    past = dict(SMALL, **{axis: 2 * block if axis in ("n_head", "batch", "head_dim") else block + 3})
    assert _error(cls, **SMALL) < 1e-5, f"{mutant} should be exact at small sizes"
    assert _error(cls, **at) < 1e-5, f"{mutant} should be exact on its block size {axis}={block}"
    assert _error(cls, **past) > 1e-3, f"{mutant} should be wrong past its block size ({axis}={past[axis]})"
