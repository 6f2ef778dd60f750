"""The mha-verify command: exit codes, one-line usage errors, reports, isolation, determinism."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.cli_run import run_cli, run_cli_process

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--no-export", "--max-examples", "5"]


def cli(*args: str, cwd: Path = ROOT, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """In this process; in a process of its own where the process is what is tested (``timeout``)."""
    return run_cli(*args, cwd=cwd) if timeout is None else run_cli_process(*args, cwd=cwd, timeout=timeout)


USAGE_ERRORS = {
    "unknown-profile": (["--profile", "nope"], "invalid choice: 'nope'"),
    "unknown-subcommand-option": (["check", "--frobnicate"], "unrecognized arguments"),
    "target-not-importable": (["--target", "no_such_pkg.mod:X"], "cannot import 'no_such_pkg.mod'"),
    "target-missing-attr": (["--target", "mha_verify.mha:Nope"], "has no attribute 'Nope'"),
    "target-file-missing": (["--target", "nowhere/x.py:A"], "does not exist"),
    "target-no-colon": (["--target", "mha"], "package.module:Attr"),
    "target-not-module": (["--target", "tests/fixtures/bad_targets.py:not_a_module"], "not a torch.nn.Module"),
    "target-not-callable": (["--target", "tests/fixtures/bad_targets.py:NOT_CALLABLE"], "not an nn.Module class"),
    "target-fails-to-build": (["--target", "tests/fixtures/bad_targets.py:FailsToBuild"], "no weights file"),
    "unknown-property": (["--only", "nope"], "unknown properties nope"),
    "bad-max-examples": (["--max-examples", "0"], "positive integer"),
    "bad-budget": (["--baseline", "b.json", "--budget", "-1"], "--budget"),
    "unknown-adapter": (["--adapter", "nope"], "unknown adapter 'nope'"),
    "target-exits-at-import": (["--target", "tests/fixtures/exits_at_import.py:X"], "SystemExit: 0"),
    "target-exits-in-init": (["--target", "tests/fixtures/bad_targets.py:ExitsInInit"], "SystemExit: 0"),
    # one forward at load: an unusable layer is one line, not a FAIL of every property
    "target-forward-always-raises": (["--target", "tests/fixtures/bad_targets.py:AlwaysRaises"],
                                     "no mask, raised RuntimeError: no kernel for this device; nothing can be checked"),
}


@pytest.mark.parametrize("case", list(USAGE_ERRORS), ids=list(USAGE_ERRORS))
def test_usage_errors_exit_2_with_one_line(case: str, tmp_path: Path) -> None:
    args, words = USAGE_ERRORS[case]
    report = tmp_path / "r.json"
    proc = cli(*FAST, "--report", str(report), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{proc.stderr}"
    assert words in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not report.exists(), "a usage error must leave no report behind"


@pytest.mark.parametrize("flag", ["--report", "--junit", "--html"])
def test_unwritable_output_is_a_usage_error(flag: str, tmp_path: Path) -> None:
    proc = cli(*FAST, flag, str(tmp_path / "missing-dir" / "out"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "does not exist" in proc.stderr


def _strip_timings(doc: dict) -> dict:
    for r in doc["results"]:
        r.pop("seconds")
    return doc


@pytest.mark.serial
@pytest.mark.deep
def test_ci_profile_is_deterministic_and_reports_parse(tmp_path: Path) -> None:
    only = "oracle_agreement,fully_masked_rows,lk_equals_lv"
    target = "tests/fixtures/seed_000.py:MultiHeadAttention"
    runs = []
    for i in range(2):
        proc = cli("--profile", "ci", "--no-export", "--only", only, "--target", target,
                   "--report", str(tmp_path / f"r{i}.json"), "--junit", str(tmp_path / f"j{i}.xml"),
                   "--html", str(tmp_path / f"h{i}.html"))
        assert proc.returncode == 1, proc.stderr  # seed 000 has real bugs
        runs.append(_strip_timings(json.loads((tmp_path / f"r{i}.json").read_text())))
    assert runs[0] == runs[1]
    verdicts = {r["name"]: r["verdict"] for r in runs[0]["results"]}
    assert verdicts == {"oracle_agreement": "fail", "fully_masked_rows": "fail", "lk_equals_lv": "pass"}
    assert runs[0]["versions"]["torch"] and "CPUExecutionProvider" in runs[0]["providers"]
    cases = ET.parse(tmp_path / "j0.xml").getroot().findall(".//testcase")
    assert [c.get("name") for c in cases] == only.split(",")
    assert len(ET.parse(tmp_path / "j0.xml").getroot().findall(".//failure")) == 2
    page = (tmp_path / "h0.html").read_text()
    assert "<svg" in page and "head 0" in page and "<script" not in page
    proc = cli("--profile", "ci", "--no-export", "--only", "fully_masked_rows", "--target", target)
    assert "export stage is skipped" not in proc.stderr  # --no-export: nothing to say
    assert "replay:  mha-verify check --no-export --only fully_masked_rows" in proc.stdout
    assert "example: B=1 Lq=" in proc.stdout and "mask fully_masked_rows" in proc.stdout


@pytest.mark.serial
@pytest.mark.deep
def test_reference_passes_and_baseline_catches_growth(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    proc = cli(*FAST, "--only", "oracle_agreement", "--baseline", str(base))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(base.read_text())
    worst = doc["worst"]["properties/oracle_agreement"]
    assert worst > 0
    doc["worst"]["properties/oracle_agreement"] = worst / 100  # pretend the past was 100x better
    base.write_text(json.dumps(doc))
    proc = cli(*FAST, "--only", "oracle_agreement", "--baseline", str(base))
    assert proc.returncode == 1
    assert "baseline" in proc.stdout and "FAIL" in proc.stdout


@pytest.mark.serial
@pytest.mark.deep
@pytest.mark.parametrize(("target", "timeout", "words"), [
    ("Segfaults", "60", "killed by SIGSEGV"),
    ("Hangs", "8", "timed out after 8 s"),
])
def test_crash_or_hang_in_the_target_fails_that_check_only(target: str, timeout: str, words: str,
                                                           tmp_path: Path) -> None:
    proc = cli(*FAST, "--timeout", timeout, "--only", "determinism,oracle_agreement",
               "--target", f"tests/fixtures/bad_targets.py:{target}", "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 1
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert [r["name"] for r in results] == ["determinism", "oracle_agreement"]
    assert all(r["verdict"] == "fail" and words in r["reason"] for r in results), results


def test_list_names_every_property_relation_and_adapter(capsys: pytest.CaptureFixture[str]) -> None:
    from mha_verify.cli import main
    from mha_verify.properties.adapters.registry import adapters
    from mha_verify.properties.invariants.suite import all_properties, all_relations

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    names = [*all_properties(), *all_relations()]
    assert len(all_properties()) >= 17 and "ort_vs_eager" in names
    listed = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert listed[:len(names)] == names, listed  # each name on a line of its own, in registration order
    for prop in all_properties().values():
        assert prop.summary in out, prop.name  # with what it states
    for adapter in adapters():
        assert f"    {adapter.name}: {adapter.description}" in out


@pytest.mark.deep
def test_only_says_that_it_skips_the_export_stage() -> None:
    proc = cli("--max-examples", "3", "--only", "lk_equals_lv")
    assert proc.returncode == 0, proc.stderr
    assert "mha-verify: --only runs the named properties only: the ONNX export stage is skipped" in proc.stderr
    assert "\nexport" not in proc.stdout  # no export table


@pytest.mark.deep
@pytest.mark.parametrize("isolation", [[], ["--no-isolation"]], ids=["isolated", "in-process"])
def test_a_target_that_exits_in_forward_fails_and_never_ends_green(isolation: list[str]) -> None:
    proc = cli("--no-export", "--max-examples", "3", "--only", "oracle_agreement,determinism", *isolation,
               "--target", "tests/fixtures/bad_targets.py:ExitsInForward")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 failed" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert "sys.exit" in proc.stdout or "SystemExit" in proc.stdout, proc.stdout


@pytest.mark.integration
@pytest.mark.parametrize(("target", "words"), [
    ("SegfaultsInInit", "killed by SIGSEGV"), ("HangsInInit", "timed out after 5 s"),
], ids=["segfault", "hang"])
def test_a_target_that_crashes_or_hangs_while_built_is_a_usage_error(target: str, words: str) -> None:
    proc = cli("--no-export", "--only", "determinism", "--timeout", "5",
               "--target", f"tests/fixtures/bad_targets.py:{target}", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "loading the target" in lines[0], proc.stderr
