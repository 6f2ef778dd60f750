"""pytest plugin (entry point ``pytest11``): choose the Hypothesis profile with ``--mha-profile``."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mha-verify")
    group.addoption(
        "--mha-profile", default=None,
        help="Hypothesis profile for attention properties: quick, ci or thorough (default: $MHA_VERIFY_PROFILE or ci)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from properties import profiles

    explicit = config.getoption("--mha-profile")
    try:
        profiles.load(explicit)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
