"""speechbrain's RoPEMHA writing (tests/fixtures/speech_rope_layers.py): a rotation applied by a function
of its module, unconditionally, is a step of its own (laws only, even head widths), never judged against
the oracle; one under an ``if`` the instance skips is not; masks whose True means ignored, inverted by a
helper for SDPA, are read as removing where True, and a twin inverting them back fails the mask laws."""

from __future__ import annotations

import pytest

from mha_verify.properties.engine.profiles import PROFILES
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

FIXTURE = "tests/fixtures/speech_rope_layers.py:"


def _verdicts(name: str, checks: tuple[str, ...]) -> dict[str, str]:
    target = load_target(FIXTURE + name)
    return {c: run_property(all_properties()[c], target, settings=PROFILES["quick"], seed=0).verdict for c in checks}


def test_a_rotation_by_a_function_of_its_module_is_a_step_of_its_own() -> None:
    conv = load_target(FIXTURE + "RopeUnion").build(8, 2).conventions
    assert conv.beyond == "a rotary or positional embedding of its own (_rope_rotate())"
    assert conv.beyond_positional and conv.head_dim_multiple == 2
    assert load_target(FIXTURE + "RopeWhenGiven").build(8, 2).conventions.beyond is None
    assert _verdicts("RopeWhenGiven", ("oracle_agreement",)) == {"oracle_agreement": "pass"}


@pytest.mark.deep
def test_masks_inverted_by_a_helper_for_sdpa_are_read_and_a_twin_inverting_them_back_fails() -> None:
    conv = load_target(FIXTURE + "RopeUnion").build(8, 2).conventions
    assert conv.mask == frozenset({"bool"})
    assert any("handed to `final_masks = masks_union(" in note for note in conv.notes)
    checks = ("masked_kv_invariance", "batch_independence", "determinism")
    assert set(_verdicts("RopeUnion", checks).values()) == {"pass"}
    assert _verdicts("RopeUnionInvertedTwice", ("masked_kv_invariance",)) == {"masked_kv_invariance": "fail"}
