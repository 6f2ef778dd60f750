"""The property suite as pytest tests, collected by the plugin when --mha-target is given."""

from __future__ import annotations

import warnings

import pytest

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import Target, load_target


@pytest.fixture(scope="session")
def mha_target(request: pytest.FixtureRequest) -> Target:
    return load_target(request.config.getoption("--mha-target"), adapter=request.config.getoption("--mha-adapter"))


@pytest.mark.parametrize("name", list(all_properties()))
def test_mha_property(name: str, mha_target: Target, request: pytest.FixtureRequest) -> None:
    settings = profiles.PROFILES[profiles.profile_name(request.config.getoption("--mha-profile"))]
    result = run_property(all_properties()[name], mha_target, settings=settings)
    if result.verdict == "n/a":
        kind = f" ({result.kind_label})" if result.kind else ""
        pytest.skip(f"not applicable{kind}: {result.reason}")
    if result.errored:  # mha-verify's own check raised: never a pass
        pytest.fail(f"no verdict: {result}", pytrace=False)
    if result.failed:
        pytest.fail(f"{result}\ncounterexample: {result.counterexample}", pytrace=False)
    if result.verdict == "finding":  # passes, and is said: in pytest's warnings summary
        said = f"{name}: finding ({result.kind_label}), not a failure: {result.reason}"
        warnings.warn(MhaFinding(said), stacklevel=1)


class MhaFinding(UserWarning):
    """A true finding that is not a defect under the layer's contract (its kind in the message)."""
