"""Reproduction bundles: a failed validation check as files that replay without this project.

A bundle directory holds ``model.onnx``, ``inputs.npz`` (the feed of the shrunk
counterexample, exactly as given to onnxruntime), ``expected.npy`` (float64),
``actual.npy`` (what onnxruntime returned; absent if it raised), ``README.txt`` (the check,
the counterexample, the verdict) and ``replay.py``, which needs only onnxruntime and numpy:
``python replay.py`` prints the max error and exits 1 if it exceeds the allowed error.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np

_REPLAY = '''"""Replay of mha-verify check {name!r}: needs only onnxruntime and numpy.

Counterexample: {counterexample}
"""
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

ALLOWED = {allowed!r}
here = Path(__file__).resolve().parent
options = ort.SessionOptions()
options.log_severity_level = 3
options.graph_optimization_level = ort.GraphOptimizationLevel.{opt_level}
session = ort.InferenceSession(str(here / "model.onnx"), options, providers=[{provider!r}])
inputs = dict(np.load(here / "inputs.npz"))
expected = np.load(here / "expected.npy")
try:
    actual = session.run([{output!r}], inputs)[0]
except Exception as exc:  # the failure may be onnxruntime refusing these shapes
    print(f"onnxruntime raised {{type(exc).__name__}}: {{exc}}")
    sys.exit(1)
diff = np.abs(actual.astype(np.float64) - expected)
error = float(diff.max()) if diff.size else 0.0
if diff.size and not np.isfinite(diff).all():
    error = float("inf")
print(f"max error {{error:.3g}} (allowed {{ALLOWED:.3g}}); shapes: "
      + ", ".join(f"{{k}}={{tuple(v.shape)}}" for k, v in inputs.items()))
sys.exit(0 if error <= ALLOWED else 1)
'''


def safe_name(name: str) -> str:
    """A check name as a directory name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "check"


def write_bundle(
    directory: str | Path, *, name: str, model_path: str | Path, feed: dict[str, np.ndarray],
    expected: np.ndarray, actual: np.ndarray | None, allowed: float, provider: str, opt_level: str,
    output: str, counterexample: str, verdict: str,
) -> Path:
    """Write a bundle for check ``name`` under ``directory`` and return its folder."""
    folder = Path(directory) / safe_name(name)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_path, folder / "model.onnx")
    np.savez(folder / "inputs.npz", **feed)  # type: ignore[arg-type]  # names are the graph inputs
    np.save(folder / "expected.npy", np.asarray(expected, dtype=np.float64))
    if actual is not None:
        np.save(folder / "actual.npy", actual)
    level = "ORT_DISABLE_ALL" if opt_level == "opt-none" else "ORT_ENABLE_ALL"
    (folder / "replay.py").write_text(_REPLAY.format(
        name=name, counterexample=counterexample, allowed=float(allowed), opt_level=level,
        provider=provider, output=output,
    ))
    (folder / "README.txt").write_text(f"check: {name}\ncounterexample: {counterexample}\nverdict: {verdict}\n"
                                       "replay: python replay.py (onnxruntime and numpy only)\n")
    return folder
