"""pytest plugin (entry point ``pytest11``).

``--mha-profile NAME`` chooses the Hypothesis profile (quick, ci, thorough).
``--mha-target SPEC`` adds the whole property suite, one test per property, run against
SPEC (``package.module:Attr`` or ``path/to/file.py:Attr``) in the user's own pytest run;
it parallelizes with pytest-xdist like any other test.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mha-verify")
    group.addoption(
        "--mha-profile", default=None,
        help="Hypothesis profile for attention properties: quick, ci or thorough (default: $MHA_VERIFY_PROFILE or ci)",
    )
    group.addoption("--mha-target", default=None, metavar="SPEC",
                    help="run the mha-verify property suite against SPEC (package.module:Attr or file.py:Attr)")
    group.addoption("--mha-adapter", default=None, help="force an mha-verify adapter for --mha-target")


def pytest_configure(config: pytest.Config) -> None:
    from properties import profiles

    try:
        profiles.load(config.getoption("--mha-profile"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    spec = config.getoption("--mha-target")
    if spec:
        from properties.targets import TargetError, load_target

        try:
            load_target(spec, adapter=config.getoption("--mha-adapter"))
        except TargetError as exc:
            raise pytest.UsageError(f"--mha-target: {exc}") from None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--mha-target"):
        return
    suite = pytest.Module.from_parent(session, path=Path(__file__).with_name("pytest_suite.py"))
    items.extend(item for item in suite.collect() if isinstance(item, pytest.Item))
