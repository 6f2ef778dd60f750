"""The pytest plugin runs the property suite against a user's module inside their own pytest run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.deep  # pytest runs in subprocesses (tox -e deep)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.serial
def test_plugin_runs_properties_against_a_user_module(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "seed_000.py", tmp_path / "attn.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--mha-target", "attn.py:MultiHeadAttention",
         "--mha-profile", "quick", "-k", "fully_masked_rows or rows_sum_to_one or lk_equals_lv", "-rfs"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # seed 000 gives NaN on fully masked rows
    assert "FAILED" in out and "test_mha_property[fully_masked_rows]" in out
    assert "1 failed, 1 passed, 1 skipped" in out, out  # lk_equals_lv: matmul refuses Lk != Lv, as seed 000 documents
    assert "not applicable: the target does not return attention weights" in out


@pytest.mark.serial
def test_plugin_passes_a_finding_and_says_it_with_its_kind(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "sdpa_layers.py", tmp_path / "attn.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--mha-target", "attn.py:SdpaAttention",
         "--mha-profile", "quick", "-k", "lk_equals_lv"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out  # torch's SDPA takes Lk != Lv: inherited, not the layer's failure
    assert "1 passed" in out and "MhaFinding: lk_equals_lv: finding (inherited), not a failure" in out, out


@pytest.mark.serial
def test_plugin_rejects_a_bad_target(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--mha-target", "nope:X"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4 and "--mha-target: cannot import 'nope'" in proc.stderr


USER_TEST = """
from hypothesis import given, settings, strategies as st


@given(st.integers())
def test_users_own(x):
    d = settings.default
    print(f"SETTINGS derandomize={d.derandomize} deadline={d.deadline} max_examples={d.max_examples}")
"""
# Hypothesis loads its own "ci" profile where one of these is set: the user's default would differ
CI_VARIABLES = ("CI", "__TOX_ENVIRONMENT_VARIABLE_ORIGINAL_CI", "TF_BUILD", "bamboo.buildKey", "BUILDKITE", "CIRCLECI",
                "CIRRUS_CI", "CODEBUILD_BUILD_ID", "GITHUB_ACTIONS", "GITLAB_CI", "HEROKU_TEST_RUN_ID",
                "TEAMCITY_VERSION")


def _users_settings(tmp_path: Path, *args: str) -> str:
    (tmp_path / "test_user.py").write_text(USER_TEST)
    env = {k: v for k, v in os.environ.items() if k not in (*CI_VARIABLES, "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    env["MHA_VERIFY_PROFILE"] = "ci"  # the suite's default: it must not leak into the user's tests either
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_user.py",
                           *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = set(re.findall(r"SETTINGS .*", proc.stdout))
    assert len(found) == 1, proc.stdout
    return found.pop()


@pytest.mark.serial
def test_plugin_leaves_a_users_hypothesis_settings_alone(tmp_path: Path) -> None:
    untouched = _users_settings(tmp_path)
    assert untouched == "SETTINGS derandomize=False deadline=0:00:00.200000 max_examples=100"
    assert _users_settings(tmp_path, "-p", "no:mha_verify") == untouched  # the same without the plugin
    # asked for by name, the profile applies to the whole run
    assert _users_settings(tmp_path, "--mha-profile", "quick") == \
        "SETTINGS derandomize=False deadline=None max_examples=25"
    assert _users_settings(tmp_path, "--mha-profile", "ci") == \
        "SETTINGS derandomize=True deadline=None max_examples=100"


@pytest.mark.serial
def test_plugin_rejects_an_unknown_profile(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--mha-profile", "nope"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4 and "--mha-profile: unknown Hypothesis profile 'nope'" in proc.stderr
