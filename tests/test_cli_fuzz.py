"""The CLI's argument space, fuzzed with Hypothesis: every command line ends in a verdict (exit 0
or 1) or a one-line usage error (exit 2), never a traceback and never another exit code.

Each drawn command runs ``check`` in this process on the reference with one or two cheap
properties (``--only`` is always among the options), so a valid command is a real, fast run.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mha_verify.cli import main

NUMBERS = ["0", "-1", "1", "2", "nan", "inf", "-inf", "1e309", "x", "", "0x10", "3.5", " 2", "4294967296"]


def _run(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``mha-verify ARGV``, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own exit
            code = exc.code if isinstance(exc.code, int) else -1
        except BaseException as exc:
            return -2, out.getvalue(), f"Traceback: {type(exc).__name__}: {exc}"
    return code, out.getvalue(), err.getvalue()


def _options(tmp: Path) -> dict[str, st.SearchStrategy[list[str]]]:
    paths = [str(tmp / "out.json"), "", str(tmp), str(tmp / "missing" / "x.json"), "/dev/null/x"]
    return {
        "--max-examples": st.sampled_from(["1", "2", *NUMBERS]).map(lambda v: ["--max-examples", v]),
        "--seed": st.sampled_from(NUMBERS).map(lambda v: ["--seed", v]),
        "--timeout": st.sampled_from(NUMBERS).map(lambda v: ["--timeout", v]),
        "--jobs": st.sampled_from(NUMBERS).map(lambda v: ["--jobs", v]),
        "--budget": st.sampled_from(NUMBERS).map(lambda v: ["--budget", v]),
        "--profile": st.sampled_from(["quick", "ci", "nope", ""]).map(lambda v: ["--profile", v]),
        "--dtype": st.sampled_from(["float32", "bfloat16", "int8", ""]).map(lambda v: ["--dtype", v]),
        "--report": st.sampled_from(paths).map(lambda v: ["--report", v]),
        "--junit": st.sampled_from(paths).map(lambda v: ["--junit", v]),
        "--baseline": st.sampled_from(paths).map(lambda v: ["--baseline", v]),
        "--adapter": st.sampled_from(["w_qkvo", "nope", "", "x.py:Nope"]).map(lambda v: ["--adapter", v]),
        "--target": st.sampled_from(["mha_verify.mha:MultiHeadAttention", "", ":", "a:b", "/nowhere.py:X"]).map(
            lambda v: ["--target", v]),
        "--frobnicate": st.just(["--frobnicate"]),
    }


def test_every_command_line_is_a_verdict_or_a_one_line_usage_error(tmp_path: Path) -> None:
    options = _options(tmp_path)
    seen: dict[int, int] = {}

    @settings(max_examples=100, deadline=None, database=None, derandomize=True,
              # the gate runs Hypothesis inside this test: the two runs draw independently
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.nested_given])
    @given(st.lists(st.sampled_from(sorted(options)), unique=True, max_size=4).flatmap(
        lambda names: st.tuples(*(options[n] for n in names))),
        st.sampled_from(["lk_equals_lv", "lk_equals_lv", "lk_equals_lv,determinism", "", ",", "nope,lk_equals_lv"]))
    def run(chosen: tuple[list[str], ...], only: str) -> None:
        argv = ["check", "--no-export", "--no-isolation", "--max-examples", "1", "--only", only]
        for pair in chosen:
            argv += pair
        code, out, err = _run(argv)
        seen[code] = seen.get(code, 0) + 1
        assert code in (0, 1, 2), (argv, code, err)
        assert "Traceback" not in out + err, (argv, err)
        if code == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and "error" in lines[0], (argv, err)
        else:  # a verdict on exactly the properties asked for (``--only ,`` once ran every one)
            assert "oracle_agreement" not in out and ("determinism" in out) == ("determinism" in only), (argv, out)

    run()
    # the space has teeth: both valid runs and usage errors were drawn
    assert seen.get(2, 0) > 0 and seen.get(0, 0) > 0, seen
    print("command lines by exit code:", seen)
    assert math.fsum(seen.values()) >= 100


def test_validate_and_export_refuse_every_bad_value_in_one_line(tmp_path: Path) -> None:
    """No model to run here: every drawn ``validate`` or ``export`` command is a usage error, in one
    line, whatever its numeric options say."""
    (tmp_path / "text.onnx").write_text("not a model")
    models = [str(tmp_path / "missing.onnx"), str(tmp_path), str(tmp_path / "text.onnx"), ""]
    value = st.sampled_from(NUMBERS)

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(st.sampled_from(models), st.lists(st.tuples(
        st.sampled_from(["--timeout", "--n-head", "--d-model", "--jobs", "--weight-seed", "--inputs", "--providers"]),
        value), max_size=3), st.booleans())
    def run(model: str, options: list[tuple[str, str]], export: bool) -> None:
        if export:  # outputs that cannot be written: a directory, a missing folder, nothing
            out = {"": "", str(tmp_path): str(tmp_path)}.get(model, str(tmp_path / "missing" / "m.onnx"))
            argv = ["export", "-o", out, "--d-model", "8", "--n-head", "2"]
        else:
            argv = ["validate", model]
        for flag, v in options:
            argv += [flag, v]
        code, out, err = _run(argv)
        assert code == 2, (argv, code, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in out + err, (argv, err)

    run()
