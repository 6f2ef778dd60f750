"""Reproduction bundles: a failed validation check as files that replay without this project.

A bundle directory holds ``model.onnx`` (and the external data files it names, for a model stored
so), ``inputs.npz`` (the feed of the shrunk counterexample, exactly as given to onnxruntime),
``expected.npy`` (float64), ``where.npy`` (bool: the positions compared, where not all are: a whole
model's padding is don't-care), ``actual.npy`` (what onnxruntime returned; absent if it raised),
``bundle.json`` (the check,
the counterexample, the verdict, the allowed error, provider, optimization level and output
name: data), ``README.txt`` and ``replay.py``, one fixed script for every bundle, which needs
only onnxruntime and numpy: ``python replay.py`` prints the max error and exits 1 if it
exceeds the allowed error. No string from the model or the check becomes code.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

#: the replay script, the same for every bundle: nothing read from a model file, a check name
#: or a counterexample is ever written into code; it reads them from bundle.json as data
REPLAY = '''"""Replay of an mha-verify check (its name and counterexample are in bundle.json): needs only
onnxruntime and numpy. Exit 0 if the error is within the allowed error, 1 otherwise."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

LEVELS = {"opt-none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "opt-all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
here = Path(__file__).resolve().parent
bundle = json.loads((here / "bundle.json").read_text(encoding="utf-8"))
allowed = float(bundle["allowed"])
if not math.isfinite(allowed) or allowed < 0 or bundle["opt"] not in LEVELS:
    sys.exit(f"bundle.json: allowed must be a finite number >= 0 and opt one of {sorted(LEVELS)}")
options = ort.SessionOptions()
options.log_severity_level = 3
options.graph_optimization_level = LEVELS[bundle["opt"]]
session = ort.InferenceSession(str(here / "model.onnx"), options, providers=[str(bundle["provider"])])
inputs = dict(np.load(here / "inputs.npz", allow_pickle=False))
expected = np.load(here / "expected.npy", allow_pickle=False)
print("check:", ascii(bundle["name"]))
try:
    actual = session.run([str(bundle["output"])], inputs)[0]
except Exception as exc:  # the failure may be onnxruntime refusing these shapes
    print("onnxruntime raised", type(exc).__name__ + ":", ascii(str(exc)))
    sys.exit(1)
diff = np.abs(actual.astype(np.float64) - expected)
if (here / "where.npy").exists():  # only these positions were compared
    where = np.load(here / "where.npy", allow_pickle=False)
    if where.shape != diff.shape or where.dtype != np.bool_:
        sys.exit(f"where.npy must be a bool array of the output's shape {diff.shape}, got {where.dtype} {where.shape}")
    diff = diff[where]
error = float(diff.max()) if diff.size else 0.0
if diff.size and not np.isfinite(diff).all():
    error = float("inf")
print(f"max error {error:.3g} (allowed {allowed:.3g}); shapes: "
      + ", ".join(f"{ascii(k)}={tuple(v.shape)}" for k, v in inputs.items()))
sys.exit(0 if error <= allowed else 1)
'''


def safe_name(name: str) -> str:
    """A check name as a directory name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "check"


def write_bundle(
    directory: str | Path, *, name: str, model_path: str | Path, feed: dict[str, np.ndarray],
    expected: np.ndarray, actual: np.ndarray | None, allowed: float, provider: str, opt_level: str,
    output: str, counterexample: str, verdict: str, where: np.ndarray | None = None,
) -> Path:
    """Write a bundle for check ``name`` under ``directory`` and return its folder; ``where`` (bool, the
    output's shape): the positions compared, where not all are."""
    folder = Path(directory) / safe_name(name)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_path, folder / "model.onnx")
    _copy_external_data(Path(model_path), folder)
    if where is not None:
        np.save(folder / "where.npy", np.asarray(where, dtype=np.bool_))
    np.savez(folder / "inputs.npz", **feed)  # type: ignore[arg-type]  # names are the graph inputs
    np.save(folder / "expected.npy", np.asarray(expected, dtype=np.float64))
    if actual is not None:
        np.save(folder / "actual.npy", actual)
    if opt_level not in ("opt-none", "opt-all"):
        raise ValueError(f"opt_level must be 'opt-none' or 'opt-all', got opt_level={opt_level!r}")
    bundle = {"name": name, "counterexample": counterexample, "verdict": verdict, "allowed": float(allowed),
              "opt": opt_level, "provider": provider, "output": output}
    (folder / "bundle.json").write_text(json.dumps(bundle, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    (folder / "replay.py").write_text(REPLAY, encoding="utf-8")
    # the README is for people: the strings from the model and the check, with control characters escaped
    (folder / "README.txt").write_text(
        f"check: {name!a}\ncounterexample: {counterexample!a}\nverdict: {verdict!a}\n"
        "replay: python replay.py (onnxruntime and numpy only; reads bundle.json)\n", encoding="utf-8")
    return folder


def _copy_external_data(model_path: Path, folder: Path) -> None:
    """The files beside ``model_path`` its tensors name as external data, copied into ``folder``: only
    plain file names (a location with a folder or ``..`` in it is never followed)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    locations = {entry.value for tensor in model.graph.initializer
                 if tensor.data_location == onnx.TensorProto.EXTERNAL
                 for entry in tensor.external_data if entry.key == "location"}
    for location in sorted(locations):
        source = model_path.parent / location
        if Path(location).name == location and not location.startswith(".") and source.is_file():
            shutil.copyfile(source, folder / location)
