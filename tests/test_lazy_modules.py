"""A library's lazy module that raises on attribute lookup, imported by the target's own call: Hypothesis's
walk of sys.modules passes it by, and an error raised outside the target's calls is never the target's
(tests/fixtures/lazy_import.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from mha_verify.properties.engine import profiles, runner
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

SPEC = "tests/fixtures/lazy_import.py:ImportsLazily"
SETTINGS = profiles.PROFILES["quick"]


@pytest.fixture(autouse=True)
def _lazy_modules_removed_after() -> Iterator[None]:
    """The fixture's modules raise on any lookup: left in sys.modules, they break whatever walks it next
    (inspect.getmodule, a file loader) in this worker."""
    yield
    for name in [n for n in sys.modules if n.startswith("lazy_backend_")]:
        del sys.modules[name]


@pytest.mark.parametrize("name", ["oracle_agreement", "key_permutation"])
def test_a_lazy_module_the_target_imports_does_not_stop_the_draw(name: str) -> None:
    result = runner.run_property(all_properties()[name], load_target(SPEC), settings=SETTINGS)
    assert result.verdict == "pass" and result.examples > 0, result


def test_an_error_outside_the_targets_calls_is_named_the_harness_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unshielded, Hypothesis's walk of sys.modules meets the lazy module and raises ImportError; where
    this worker first imported other modules during the first example, the constants Hypothesis reads
    from new modules change between its runs and it raises FlakyStrategyDefinition first (seen on a
    clean clone with -n 2). Either is raised by the example generation, outside the target's calls."""
    monkeypatch.setattr(runner, "shield_module_walk", lambda: None)
    result = runner.run_property(all_properties()["query_permutation"], load_target(SPEC), settings=SETTINGS)
    assert result.verdict == "error", result
    raised = str(result.reason).removeprefix("not the target's: mha-verify's example generation raised ")
    assert raised != str(result.reason), result.reason
    assert raised.startswith(("ImportError", "FlakyStrategyDefinition")), result.reason
    assert "the target raised" not in str(result.reason)
