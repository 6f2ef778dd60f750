"""pytest plugin (entry point ``pytest11``).

``--mha-target SPEC`` adds the whole property suite, one test per property, run against
SPEC (``package.module:Attr`` or ``path/to/file.py:Attr``) in the user's own pytest run;
it parallelizes with pytest-xdist like any other test. Those tests run under the profile
chosen by ``--mha-profile NAME`` (quick, ci, thorough), else $MHA_VERIFY_PROFILE, else ci,
passed to each property explicitly.

The plugin leaves the user's own Hypothesis settings alone: only an explicit
``--mha-profile`` loads that profile globally, for every test of the run.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mha-verify")
    group.addoption(
        "--mha-profile", default=None,
        help="Hypothesis profile: quick, ci or thorough. The --mha-target tests use it (default: "
             "$MHA_VERIFY_PROFILE or ci); given explicitly, it is also loaded for every other test of the run",
    )
    group.addoption("--mha-target", default=None, metavar="SPEC",
                    help="run the mha-verify property suite against SPEC (package.module:Attr or file.py:Attr)")
    group.addoption("--mha-adapter", default=None, help="force an mha-verify adapter for --mha-target")


def pytest_configure(config: pytest.Config) -> None:
    explicit = config.getoption("--mha-profile")
    spec = config.getoption("--mha-target")
    if explicit is None and not spec:
        return  # not asked for: import nothing, change nothing
    from mha_verify.properties.engine import profiles

    try:
        if explicit is not None:
            profiles.load(explicit)  # asked for by name: the whole run uses it
        else:
            profiles.profile_name()  # checks $MHA_VERIFY_PROFILE for the suite's own tests
    except ValueError as exc:
        raise pytest.UsageError(f"{'--mha-profile' if explicit else '$MHA_VERIFY_PROFILE'}: {exc}") from None
    if spec:
        from mha_verify.properties.targets.eager import TargetError, load_target

        try:
            load_target(spec, adapter=config.getoption("--mha-adapter"))
        except TargetError as exc:
            raise pytest.UsageError(f"--mha-target: {exc}") from None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--mha-target"):
        return
    suite = pytest.Module.from_parent(session, path=Path(__file__).with_name("pytest_suite.py"))
    items.extend(item for item in suite.collect() if isinstance(item, pytest.Item))
