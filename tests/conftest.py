"""Shared test set-up: the tiers, the Hypothesis profile of the suite's own ``@given`` tests, the ``cli``
fixture and small helpers.

The tiers are by cost (docs/development.md): a test marked ``integration`` needs real processes, one
marked ``deep`` is long; every other test is marked ``unit`` here, and ``-m unit`` (the README's test
command) runs them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable

import pytest
import torch
from hypothesis import settings

from mha_verify.properties.engine import profiles, runner
from mha_verify.properties.engine.results import CheckResult
from tests.cli_run import run_cli

# The suite's own @given tests run at the examples of `quick`, derandomized: the same examples on every run,
# as `ci` would, at a quarter of its cost. MHA_VERIFY_PROFILE (or --mha-profile) picks one of the CLI's
# profiles instead, e.g. `thorough` before a release. Tests that run properties name their settings.
TEST_PROFILE = profiles.REGISTERED_PREFIX + "tests"
settings.register_profile(TEST_PROFILE, profiles.PROFILES["quick"], derandomize=True, print_blob=True)
if os.environ.get(profiles.PROFILE_ENV):
    profiles.load()
else:
    settings.load_profile(TEST_PROFILE)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # each xdist worker has a core of its own: one intra-op thread, not two workers x two threads
    torch.set_num_threads(1)

TIERS = ("integration", "deep")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(tiers)}: a test is in one tier")
        if not tiers:
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("serial") and "deep" not in tiers:
            raise pytest.UsageError(f"{item.nodeid} is marked serial: only a deep test is run one at a time")


def _trim() -> Callable[[], object] | None:
    """glibc's malloc_trim, where there is one: it hands the heap a test freed back to the system."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _trim()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After a deep or integration test, free what it left: an xdist worker lives for the whole tier, and
    without this the heap of the checks it ran in-process (up to D = 1024) stays mapped; two workers
    reached 11 GB each and the machine thrashed."""
    if _MALLOC_TRIM is not None and any(item.get_closest_marker(t) for t in TIERS):
        gc.collect()
        _MALLOC_TRIM(0)


@pytest.fixture(autouse=True)
def _first_failure_is_the_counterexample(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked ``shrinks`` runs its checks with no shrinking: the first failing example is the
    counterexample. Such a test asserts a verdict, and the verdict is the same before and after shrinking;
    shrinking took nine tenths of the time of a failing check (a twin whose softmax runs over the queries:
    52 s, 4.7 s without). A test that asserts what the counterexample is, or what shrinking does, is
    marked ``shrinks`` and keeps the runner's budget (SHRINK_STEPS), as does a CLI run in a process of its own."""
    if request.node.get_closest_marker("shrinks") is None:
        monkeypatch.setattr(runner, "SHRINK_STEPS", 0)


@pytest.fixture
def cli() -> Callable[..., object]:
    """``cli(*args, cwd=ROOT, env=None)``: ``mha-verify ARGS`` run in this process (tests/cli_run.py)."""
    return run_cli


def seeded_mha(d_model: int, n_head: int, dropout: float = 0.0, seed: int = 0, **kw: object) -> torch.nn.Module:
    """The reference module with weights drawn from ``seed``, in eval mode."""
    from mha_verify.mha import MultiHeadAttention

    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_head, dropout, **kw).eval()  # type: ignore[arg-type]


def assert_verdict(result: CheckResult, verdict: str, floor: int) -> None:
    """``result`` is ``verdict``, earned: a pass compared at least ``floor`` examples; a fail is a violation the
    check measured on an example it compared (an error beyond its allowance, or a non-finite one), never an
    exception. A fail stops at its first failing example (``_first_failure_is_the_counterexample``), and its
    count (the examples that held before it) says nothing about it."""
    assert result.verdict == verdict, result
    if verdict == "pass":
        assert result.examples >= floor, result
    elif verdict == "fail":
        assert not result.reason.startswith("the target raised"), result
        assert result.worst_error is not None and result.allowed is not None, result
        assert not result.worst_error <= result.allowed, result  # beyond it, or NaN
