"""Reproduction bundles of an eager layer's failure (cli/eager_bundle.py): a replay.py that needs
only torch and the layer's library builds the layer from data, makes the harness's call, and exits
1 on the bug, 0 once it is gone, 2 when it cannot run; a hostile bundle.json runs nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mha_verify.eager_bundle import write_eager_bundle
from mha_verify.properties.engine import profiles
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.engine.runner import run_property
from mha_verify.properties.invariants.suite import all_properties
from mha_verify.properties.targets.eager import load_target

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = profiles.PROFILES["quick"]


@pytest.fixture(autouse=True, scope="module")
def _layers_importable() -> Iterator[None]:
    """The layers of these tests live in tests/, importable as a library's would be (the writer
    runs replay.py once, in a fresh interpreter)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(ROOT))
        yield


@pytest.fixture(scope="module")
def softmax_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[CheckResult, Path]:
    """The bundle of SoftmaxInFloat16's oracle_agreement failure, written once (copied per test)."""
    out = tmp_path_factory.mktemp("bundles")
    result = _failed("tests.mutants:SoftmaxInFloat16", "oracle_agreement", out)
    (folder,) = out.iterdir()
    return result, folder


def _copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def _failed(spec: str, name: str, out: Path) -> CheckResult:
    target = load_target(spec)
    result = run_property(all_properties()[name], target, settings=SETTINGS,
                          on_failure=lambda r, ex, dtype: write_eager_bundle(out, target, r, ex, dtype))
    assert result.verdict == "fail", result
    return result


def _replay(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "replay.py"], cwd=folder, capture_output=True, text=True, timeout=180)


@pytest.mark.deep
def test_a_wrong_output_replays_standalone_and_passes_once_the_layer_is_fixed(
        softmax_bundle: tuple[CheckResult, Path], tmp_path: Path) -> None:
    result, written = softmax_bundle
    assert str(result.details["bundle"]) == f"bundle {written}: " + str(result.details["bundle"]).split(": ", 1)[1]
    assert "exited 1, showing the bug" in str(result.details["bundle"])
    folder = _copy(written, tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["README.txt", "bundle.json", "replay.py", "tensors.pt"]
    assert "mha_verify" not in (folder / "replay.py").read_text()
    got = _replay(folder)
    assert got.returncode == 1, got.stderr
    assert "actual: max error" in got.stdout and "against the float64 oracle" in got.stdout
    readme = (folder / "README.txt").read_text()
    assert "cause:" in readme and "expected:" in readme and "inputs:" in readme
    bundle = json.loads((folder / "bundle.json").read_text())
    assert bundle["mode"] == "differs" and bundle["build"]["class"] == "SoftmaxInFloat16"
    # the same weights in the reference, whose softmax is right: the replay passes
    bundle["build"].update(module="mha_verify.mha", **{"class": "MultiHeadAttention"})
    (folder / "bundle.json").write_text(json.dumps(bundle))
    fixed = _replay(folder)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


@pytest.mark.deep
def test_a_call_that_raises_replays_as_raising(tmp_path: Path) -> None:
    result = _failed("tests.fixtures.kind_layers:KeysViewedWithQueryLength", "oracle_agreement", tmp_path)
    (folder,) = tmp_path.iterdir()
    assert json.loads((folder / "bundle.json").read_text())["mode"] == "raises", result.details["bundle"]
    got = _replay(folder)
    assert got.returncode == 1 and "actual: raised RuntimeError" in got.stdout, got.stdout + got.stderr


@pytest.mark.deep
def test_an_output_of_the_wrong_shape_replays_as_differing(tmp_path: Path) -> None:
    result = _failed("tests.fixtures.kind_layers:KeysViewedLikeEsm", "oracle_agreement", tmp_path)
    (folder,) = tmp_path.iterdir()
    assert "exited 1, showing the bug" in str(result.details["bundle"]), result.details["bundle"]
    got = _replay(folder)
    assert got.returncode == 1 and "actual:" in got.stdout, got.stdout + got.stderr


@pytest.mark.deep
def test_a_failure_no_single_call_shows_gets_no_bundle_and_says_why(tmp_path: Path) -> None:
    result = _failed("tests.mutants:ValuesDetached", "grad_agreement", tmp_path)
    assert str(result.details["bundle"]).startswith("no bundle: the layer's plain call on the counterexample agrees")
    assert not any(tmp_path.iterdir())


@pytest.mark.integration  # runs the bundle's replay.py as a process of its own
@pytest.mark.parametrize("field", ["module", "class"])
def test_a_hostile_bundle_runs_nothing_and_exits_2(softmax_bundle: tuple[CheckResult, Path], tmp_path: Path,
                                                   field: str) -> None:
    folder = _copy(softmax_bundle[1], tmp_path)
    bundle = json.loads((folder / "bundle.json").read_text())
    marker = tmp_path / "pwned"
    bundle["build"][field] = f"os;open({str(marker)!r},'w')"
    (folder / "bundle.json").write_text(json.dumps(bundle))
    got = _replay(folder)
    assert got.returncode == 2 and "is not a dotted Python name" in got.stderr, got.stdout + got.stderr
    assert not marker.exists()


@pytest.mark.integration  # runs the bundle's replay.py as a process of its own
def test_a_bundle_naming_a_callable_that_is_no_layer_runs_nothing(softmax_bundle: tuple[CheckResult, Path],
                                                                 tmp_path: Path) -> None:
    folder = _copy(softmax_bundle[1], tmp_path)
    marker = tmp_path / "pwned"
    bundle = json.loads((folder / "bundle.json").read_text())
    bundle["build"] = {"module": "os", "class": "system", "args": [f"touch {marker}"]}
    (folder / "bundle.json").write_text(json.dumps(bundle))
    got = _replay(folder)
    assert got.returncode == 2 and "is not a subclass of Module" in got.stderr, got.stdout + got.stderr
    assert not marker.exists()


@pytest.mark.deep
def test_checks_failing_for_one_cause_share_one_bundle(tmp_path: Path) -> None:
    first = _failed("tests.fixtures.kind_layers:KeysViewedWithQueryLength", "oracle_agreement", tmp_path)
    second = _failed("tests.fixtures.kind_layers:KeysViewedWithQueryLength", "head_split", tmp_path)
    (folder,) = tmp_path.iterdir()
    assert str(first.details["bundle"]).startswith(f"bundle {folder}:"), first.details["bundle"]
    assert str(second.details["bundle"]).startswith(f"no new bundle: the same cause as the bundle {folder} ("), \
        second.details["bundle"]
    # another cause in the same folder (a wrong softmax, no exception) gets a bundle of its own
    _failed("tests.mutants:SoftmaxInFloat16", "oracle_agreement", tmp_path)
    assert len(list(tmp_path.iterdir())) == 2


@pytest.mark.deep
def test_a_layer_built_with_a_window_replays_with_its_window(tmp_path: Path) -> None:
    # its constructor takes a window as a sequence (MONAI's Swin ``window_size``): written as a tuple
    _failed("tests.fixtures.window_table_layers:WindowTableTransposed", "oracle_agreement", tmp_path)
    (folder,) = tmp_path.iterdir()
    assert json.loads((folder / "bundle.json").read_text())["build"]["kwargs"]["window_size"] == {"tuple": [4, 4]}
    got = _replay(folder)
    assert got.returncode == 1 and "actual: max error" in got.stdout, got.stdout + got.stderr
