"""Hypothesis settings profiles, registered in one place.

quick     a fast local loop: few examples, random.
ci        derandomized (same examples every run), no deadline, prints reproduction blobs.
thorough  many examples, random, for nightly runs or before a release.

Choose one with the environment variable MHA_VERIFY_PROFILE, pytest's ``--mha-profile``
or ``mha-verify check --profile``. The runner passes the chosen settings to each property
explicitly; nothing here changes Hypothesis's global default unless ``load()`` is called.

They are registered with Hypothesis under ``mha-verify-<name>`` (``REGISTERED_PREFIX``):
Hypothesis has a "ci" profile of its own, which it loads on CI machines, and a user may have
one too; registering ours as plain "ci" would replace theirs (and, with theirs loaded, load
ours in its place).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "MHA_VERIFY_PROFILE"
DEFAULT_PROFILE = "ci"

_COMMON = {
    "deadline": None,  # the first call of a shape pays torch's warm-up; timing is for benchmarks
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.differing_executors],
}

# Every setting that a Hypothesis profile of its own could change is given here. A settings
# object takes what it leaves out from the profile loaded when it is built, and Hypothesis
# loads its own "ci" profile (derandomize, no database) wherever $CI is set: on a CI machine
# `quick` and `thorough` became derandomized. No database unless asked (`--database DIR`).
PROFILES: dict[str, settings] = {
    "quick": settings(max_examples=25, derandomize=False, print_blob=False, database=None,
                      **_COMMON),  # type: ignore[arg-type]
    "ci": settings(max_examples=100, derandomize=True, print_blob=True, database=None,
                   **_COMMON),  # type: ignore[arg-type]
    "thorough": settings(max_examples=1000, derandomize=False, print_blob=True, database=None,
                         **_COMMON),  # type: ignore[arg-type]
}

REGISTERED_PREFIX = "mha-verify-"

for _name, _settings in PROFILES.items():
    settings.register_profile(REGISTERED_PREFIX + _name, _settings)


def profile_name(explicit: str | None = None) -> str:
    """The profile to use: ``explicit``, else $MHA_VERIFY_PROFILE, else 'ci'; checked."""
    name = explicit or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if name not in PROFILES:
        raise ValueError(f"unknown Hypothesis profile {name!r}; choose one of {', '.join(PROFILES)}")
    return name


def load(explicit: str | None = None) -> str:
    """Load the chosen profile globally (our own test suite, or ``--mha-profile``) and return its name."""
    name = profile_name(explicit)
    settings.load_profile(REGISTERED_PREFIX + name)
    return name
