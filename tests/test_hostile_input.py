"""Input from users and model files is data, never code: reproduction bundles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from mha_verify.export.onnx_export import export_onnx
from mha_verify.properties.targets.eager import load_target
from mha_verify.repro_bundle import REPLAY, write_bundle

HOSTILE = [
    '"""\nimport pathlib; pathlib.Path("PWNED").write_text("x")\n"""',
    "'''\nimport pathlib; pathlib.Path('PWNED').write_text('x')\n'''",
    "{__import__('pathlib').Path('PWNED').write_text('x')}",
    "\x1b[31mred\x1b[0m\r\n\x00",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    path = tmp_path_factory.mktemp("hostile") / "ref.onnx"
    bound = load_target().build(8, 2, seed=0)
    export_onnx(bound, path, exporter="torchscript")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 3, 8, generator=gen) for _ in range(3))
    mask = torch.ones(1, 1, 1, 1, dtype=torch.bool)
    feed = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "mask": mask.numpy()}
    expected = bound(q, k, v, mask).detach().double().numpy()
    return path, feed, expected


@pytest.mark.parametrize("hostile", HOSTILE, ids=["triple-double", "triple-single", "f-string", "control"])
def test_a_bundle_replays_hostile_strings_as_data(model: tuple[Path, dict[str, np.ndarray], np.ndarray],
                                                  hostile: str, tmp_path: Path) -> None:
    path, feed, expected = model
    actual = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["out"], feed)[0]
    folder = write_bundle(tmp_path / "bundles", name=hostile, model_path=path, feed=feed, expected=expected,
                          actual=actual, allowed=1e-4, provider="CPUExecutionProvider", opt_level="opt-all",
                          output="out", counterexample=hostile, verdict=hostile)
    assert (folder / "replay.py").read_text() == REPLAY  # one fixed script: nothing of the input in it
    assert json.loads((folder / "bundle.json").read_text())["name"] == hostile  # the input, kept as data
    assert "\x1b" not in (folder / "README.txt").read_text()  # escaped for a terminal
    proc = subprocess.run([sys.executable, str(folder / "replay.py")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the graph computes the eager output
    assert "max error" in proc.stdout and "\x1b" not in proc.stdout
    assert not (tmp_path / "PWNED").exists() and not (folder / "PWNED").exists()


def test_a_tampered_bundle_is_refused_not_run(model: tuple[Path, dict[str, np.ndarray], np.ndarray],
                                              tmp_path: Path) -> None:
    path, feed, expected = model
    folder = write_bundle(tmp_path, name="c", model_path=path, feed=feed, expected=expected, actual=None,
                          allowed=1e-4, provider="CPUExecutionProvider", opt_level="opt-all", output="out",
                          counterexample="", verdict="")
    bundle = json.loads((folder / "bundle.json").read_text())
    (folder / "bundle.json").write_text(json.dumps({**bundle, "opt": "__import__('os')"}))
    proc = subprocess.run([sys.executable, str(folder / "replay.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "opt one of" in proc.stderr, proc.stdout + proc.stderr
    with pytest.raises(ValueError, match="opt_level"):
        write_bundle(tmp_path, name="c", model_path=path, feed=feed, expected=expected, actual=None, allowed=1e-4,
                     provider="CPUExecutionProvider", opt_level="ORT_ENABLE_ALL; import os", output="out",
                     counterexample="", verdict="")


def test_a_bundle_copies_external_data_by_plain_name_only_and_compares_where_said(
        model: tuple[Path, dict[str, np.ndarray], np.ndarray], tmp_path: Path) -> None:
    """A model stored with external data (onnxruntime-genai's builder writes model.onnx.data) replays
    from its bundle; a location with a folder in it is never followed. ``where.npy`` limits the
    comparison: a difference outside it (a whole model's padding) does not count."""
    import onnx

    path, feed, expected = model
    stored = onnx.load(str(path))
    onnx.save(stored, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data",
              size_threshold=0)
    off = expected.copy()
    off[0, 0] += 1.0  # wrong at one position, outside where
    where = np.ones_like(expected, dtype=bool)
    where[0, 0] = False
    folder = write_bundle(tmp_path / "b", name="ext", model_path=tmp_path / "ext.onnx", feed=feed, expected=off,
                          actual=None, allowed=1e-4, provider="CPUExecutionProvider", opt_level="opt-all",
                          output="out", counterexample="", verdict="", where=where)
    assert (folder / "ext.onnx.data").is_file()
    proc = subprocess.run([sys.executable, str(folder / "replay.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    np.save(folder / "where.npy", np.ones_like(expected, dtype=bool))  # every position: the planted one counts
    proc = subprocess.run([sys.executable, str(folder / "replay.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "max error 1" in proc.stdout, proc.stdout + proc.stderr
    hostile = onnx.load(str(tmp_path / "ext.onnx"), load_external_data=False)
    for tensor in hostile.graph.initializer:  # a hostile location: outside the model's folder
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../secret.data"
    (tmp_path / "secret.data").write_bytes(b"not yours")
    (tmp_path / "m").mkdir()
    onnx.save(hostile, str(tmp_path / "m" / "hostile.onnx"))
    folder = write_bundle(tmp_path / "c", name="h", model_path=tmp_path / "m" / "hostile.onnx", feed=feed,
                          expected=expected, actual=None, allowed=1e-4, provider="CPUExecutionProvider",
                          opt_level="opt-all", output="out", counterexample="", verdict="")
    assert sorted(p.name for p in folder.iterdir()) == ["README.txt", "bundle.json", "expected.npy", "inputs.npz",
                                                          "model.onnx", "replay.py"]


def test_control_characters_never_reach_xml_or_a_terminal() -> None:
    import xml.etree.ElementTree as ET

    from mha_verify import report_junit, report_text
    from mha_verify.escape import printable
    from mha_verify.properties.engine.results import CheckResult

    ansi = "the target raised RuntimeError: \x1b[31mboom\x1b[0m\x00\x07"
    results = [CheckResult("oracle_agreement\x1b[2J", "properties", "fail", reason=ansi, counterexample="B=1\x1b"),
               CheckResult("lk_equals_lv", "properties", "n/a", reason="\x1bnot here")]
    root = ET.fromstring(report_junit.document(results, target="x.py:\x1b[31mA"))  # parses: valid XML
    text = ET.tostring(root, encoding="unicode")
    assert "\x1b" not in text and "\\x1b[31mboom" in text
    shown = printable(report_text.failures(results))
    assert "\x1b" not in shown and "\x00" not in shown and "\\x1b" in shown


def _external_model(path: Path, location: str) -> None:
    """A one-MatMul model whose (4, 4) weight is external data at ``location`` (relative to ``path``)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    for key, value in (("location", location), ("offset", "0"), ("length", "64")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("MatMul", ["q", "w"], ["out"])], "g",
                              [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", "l", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "l", 4])], [w])
    path.write_bytes(helper.make_model(graph).SerializeToString())


def test_external_data_outside_the_models_folder_is_a_one_line_usage_error(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(np.ones(16, np.float32).tobytes())
    _external_model(folder / "model.onnx", "../outside.bin")
    proc = subprocess.run([sys.executable, "-m", "mha_verify.cli", "validate", str(folder / "model.onnx")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "points outside the model's folder" in proc.stderr


def test_external_data_past_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from mha_verify.properties.onnx.model_file import ModelError, load_model

    (tmp_path / "weights.bin").write_bytes(b"\0" * 4096)  # stands in for a file of gigabytes
    _external_model(tmp_path / "model.onnx", "weights.bin")
    with pytest.raises(ModelError, match="more than the"):
        load_model(tmp_path / "model.onnx", max_external_bytes=1024)
    assert load_model(tmp_path / "model.onnx", max_external_bytes=8192).graph.initializer[0].raw_data


def test_small_input_mistakes_are_named() -> None:
    import argparse

    from mha_verify.cli import _replay_command
    from mha_verify.properties.onnx.interface import parse_input_map
    from mha_verify.properties.onnx.model_file import ModelError, load_model

    with pytest.raises(ValueError, match="names role q twice"):
        parse_input_map("q=a,k=b,q=c")
    with pytest.raises(ModelError, match="is a directory"):
        load_model(Path(__file__).parent)
    args = argparse.Namespace(target=None, adapter=None, profile=None, max_examples=None, seed=None,
                              dtype="float32", database="db dir")
    assert _replay_command(args, "oracle_agreement").endswith("--database 'db dir'")


@pytest.mark.integration
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device whose writes fail: ENOSPC)")
def test_a_full_disk_is_one_line_naming_the_file_and_the_other_reports_are_written(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mha_verify.cli", "--no-export", "--no-isolation", "--max-examples",
                           "2", "--only", "lk_equals_lv", "--report", "/dev/full", "--junit", str(tmp_path / "j.xml")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "could not write /dev/full" in lines[-1] and "Traceback" not in proc.stderr
    assert (tmp_path / "j.xml").stat().st_size > 0  # written: the failing one did not stop it
