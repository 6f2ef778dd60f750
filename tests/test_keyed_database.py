"""Each (property, target) has its own example-database entries: a stored failure is replayed
for that check first, and for no other (public Hypothesis API: an ExampleDatabase subclass)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase
from hypothesis import settings as Settings
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from mha_verify.gate import make_settings, seed_for
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.keyed_database import PrefixedDatabase, keyed
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

SEED_000 = f"{Path(__file__).resolve().parent / 'fixtures' / 'seed_000.py'}:MultiHeadAttention"


def test_prefixes_keep_keys_apart() -> None:
    inner = InMemoryExampleDatabase()
    a, b = PrefixedDatabase(inner, b"a"), PrefixedDatabase(inner, b"b")
    a.save(b"k", b"1")
    a.save(b"k", b"2")
    a.move(b"k", b"j", b"2")
    a.delete(b"k", b"nothing")
    assert (set(a.fetch(b"k")), set(a.fetch(b"j")), set(b.fetch(b"k"))) == ({b"1"}, {b"2"}, set())
    assert a == PrefixedDatabase(inner, b"a") and a != b


def test_keyed_settings() -> None:
    inner = InMemoryExampleDatabase()
    s = keyed(Settings(database=inner), "fully_masked_rows|mha:MultiHeadAttention")
    assert s.database == PrefixedDatabase(inner, b"fully_masked_rows|mha:MultiHeadAttention")
    derandomized = profiles.PROFILES["ci"]
    assert keyed(derandomized, "x") is derandomized  # Hypothesis stores nothing: nothing to key
    with pytest.raises(ValueError, match="key="):
        keyed(s, "")
    with pytest.raises(TypeError, match="inner="):
        PrefixedDatabase(object(), b"x")  # type: ignore[arg-type]


@pytest.mark.integration
def test_profiles_do_not_take_hypothesis_own_ci_profile() -> None:
    """Hypothesis loads its "ci" profile (derandomize, no database) wherever $CI is set; a
    profile of ours that left a setting out took it from there, and `quick` ran derandomized.
    Each subprocess loads one of Hypothesis's profiles before ours are built (CI or not alike:
    Hypothesis counts $CI as set even when it is empty)."""
    code = ("import sys; from hypothesis import settings; settings.load_profile(sys.argv[1]); "
            "from properties.engine import profiles as p; "
            "print([(n, s.derandomize, s.database, s.print_blob) for n, s in p.PROFILES.items()])")
    seen = {name: subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True,
                                 check=True).stdout for name in ("ci", "default")}
    assert seen["ci"] == seen["default"], seen
    assert seen["default"].strip() == str([("quick", False, None, False), ("ci", True, None, True),
                                           ("thorough", False, None, True)])


def _stored_failure_replays(generate: Settings, seed: int | None) -> None:
    props = all_properties()
    seed_000, reference = load_target(SEED_000), load_target()
    first = run_property(props["fully_masked_rows"], seed_000, settings=generate, seed=seed)
    assert first.verdict == "fail" and first.counterexample

    replay_only = Settings(generate, phases=[Phase.reuse])  # examples from the database, nothing new
    again = run_property(props["fully_masked_rows"], seed_000, settings=replay_only, seed=seed)
    assert again.verdict == "fail" and again.counterexample == first.counterexample
    # the same property on another target, and another property on the same target: nothing replayed
    other_target = run_property(props["fully_masked_rows"], reference, settings=replay_only, seed=seed)
    other_property = run_property(props["oracle_agreement"], seed_000, settings=replay_only, seed=seed)
    for other in (other_target, other_property):  # with no stored example Hypothesis skips the test
        assert other.examples == 0 and "run no test cases" in (other.reason or ""), other


@pytest.mark.deep
def test_a_stored_failure_replays_for_its_own_property_and_target_only(tmp_path: Path) -> None:
    _stored_failure_replays(Settings(profiles.PROFILES["quick"], max_examples=20,
                                     database=DirectoryBasedExampleDatabase(str(tmp_path / "db"))), seed=None)


@pytest.mark.deep
def test_the_ci_profile_with_a_database_stores_and_replays(tmp_path: Path) -> None:
    """`--database` with the ci profile draws from a fixed seed; Hypothesis's @seed drops the
    database from the settings it finds, so the runner puts its settings on after the seed."""
    db = str(tmp_path / "db")
    _stored_failure_replays(make_settings("ci", max_examples=20, database=db), seed=seed_for("ci", None, db))
