"""eager_vs_sdpa: a layer that runs through more than one attention implementation its library ships is held
to the oracle on each, on identical inputs and weights; a bug on one path alone fails, naming that path
(the transformers layers themselves are in tests/ecosystem/test_spec.py)."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.protocol import TargetError
from mha_verify.properties.targets.eager import load_target
from tests.conftest import assert_verdict

FIXTURE = "tests/fixtures/two_paths.py:"
QUICK = profiles.PROFILES["quick"]


def test_a_layer_right_on_both_paths_passes() -> None:
    target = load_target(FIXTURE + "TwoPaths")
    assert "built sdpa; also run eager" in target.build(8, 2).conventions.describe()
    assert_verdict(run_property(all_properties()["eager_vs_sdpa"], target, settings=QUICK, seed=0), "pass", 10)


def test_a_mask_dropped_on_the_eager_path_alone_fails_naming_that_path() -> None:
    target = load_target(FIXTURE + "EagerMaskAfterSoftmax")
    result = run_property(all_properties()["eager_vs_sdpa"], target, settings=QUICK, seed=0)
    assert_verdict(result, "fail", 1)
    assert "the eager path off the oracle" in (result.reason or ""), result.reason
    # the path it is built with is right: every other check passes it
    assert_verdict(run_property(all_properties()["oracle_agreement"], target, settings=QUICK, seed=0), "pass", 10)


def test_implementations_are_declared_as_distinct_names() -> None:
    with pytest.raises(TargetError, match="implementations"):
        load_target(FIXTURE + "UndeclaredPaths")
