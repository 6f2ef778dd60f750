"""Validation in a child process, so that a crash of onnxruntime (a segfault, an abort, a
hang) becomes a failed CheckResult instead of taking the caller down.

``validate_isolated`` runs ``python -m export.isolate`` with a JSON job and reads the
results back from a JSON file; a child killed by a signal or past ``timeout`` gives one
failed ``<config>/isolated`` result saying so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from export.ort_model import ModelError, ModelInterface, read_interface
from export.validate import STAGE, model_dtype, validate_model
from properties import profiles
from properties.results import CheckResult
from properties.targets import Bound, TargetError, load_target


def bind_to_model(
    info: ModelInterface, *, target_spec: str | None = None, weights: str | Path | None = None, seed: int = 0,
    d_model: int | None = None, n_head: int | None = None,
) -> Bound:
    """Build the target at the model's size and dtype, with ``weights`` (a state_dict) if given.

    d_model and n_head default to the model's metadata (or its input shapes). Raises
    ModelError / TargetError (usage errors) when they cannot be told or the weights do not fit.
    """
    d = d_model if d_model is not None else info.d_model
    h = n_head if n_head is not None else info.n_head
    if d is None or h is None:
        raise ModelError(f"cannot tell d_model and n_head of {str(info.path)!r} (no mha-verify metadata); "
                         "pass --d-model and --n-head")
    bound = load_target(target_spec).build(d, h, seed=seed, dtype=model_dtype(info))
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            raise TargetError(f"weights file {str(path)!r} does not exist")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            bound.module.load_state_dict(state)
        except Exception as exc:
            raise TargetError(f"cannot load weights {str(path)!r}: {type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
        bound.module.to(model_dtype(info)).eval()
    return bound


def _from_json(data: dict[str, object]) -> CheckResult:
    for key in ("worst_error", "allowed"):
        if isinstance(data.get(key), str):
            data[key] = float(data[key])  # type: ignore[arg-type]
    return CheckResult(**data)  # type: ignore[arg-type]


def validate_isolated(
    path: str | Path, *, target_spec: str | None = None, weights: str | Path | None = None, seed: int = 0,
    profile: str | None = None, providers: Sequence[str] = ("cpu",), bundle_dir: str | Path | None = None,
    d_model: int | None = None, n_head: int | None = None, timeout: float = 600.0,
) -> list[CheckResult]:
    """:func:`export.validate.validate_model` in a child process (same arguments, by value).

    Usage errors (ModelError, TargetError) are raised here, before the child starts.
    """
    info = read_interface(path)
    bind_to_model(info, target_spec=target_spec, weights=weights, seed=seed, d_model=d_model, n_head=n_head)
    profile = profiles.profile_name(profile)
    with tempfile.TemporaryDirectory(prefix="mha-verify-isolate-") as tmp:
        out = Path(tmp) / "results.json"
        job = {"path": str(Path(path).resolve()), "target_spec": target_spec, "seed": seed, "profile": profile,
               "weights": None if weights is None else str(Path(weights).resolve()), "providers": list(providers),
               "bundle_dir": None if bundle_dir is None else str(Path(bundle_dir).resolve()),
               "d_model": d_model, "n_head": n_head, "out": str(out)}
        name = f"{info.config}/isolated"
        try:
            proc = subprocess.run([sys.executable, "-m", "export.isolate", json.dumps(job)], capture_output=True,
                                  text=True, timeout=timeout, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        except subprocess.TimeoutExpired:
            return [CheckResult(name, STAGE, "fail", seconds=timeout,
                                reason=f"validation did not finish within {timeout:g} s (a hang in onnxruntime?)")]
        if proc.returncode < 0:
            sig = signal.Signals(-proc.returncode).name
            return [CheckResult(name, STAGE, "fail", reason=f"the validating process crashed with {sig}: "
                                f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")]
        if proc.returncode not in (0, 1) or not out.is_file():
            tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output"
            return [CheckResult(name, STAGE, "fail", reason=f"the validating process exited {proc.returncode}: {tail}")]
        return [_from_json(r) for r in json.loads(out.read_text())]


def _child(job: dict[str, object]) -> int:
    info = read_interface(str(job["path"]))
    bound = bind_to_model(info, target_spec=job["target_spec"], weights=job["weights"],  # type: ignore[arg-type]
                          seed=int(str(job["seed"])), d_model=job["d_model"], n_head=job["n_head"])  # type: ignore[arg-type]
    results = validate_model(str(job["path"]), bound, settings=profiles.PROFILES[str(job["profile"])],
                             providers=job["providers"], bundle_dir=job["bundle_dir"])  # type: ignore[arg-type]
    Path(str(job["out"])).write_text(json.dumps([r.to_json() for r in results]))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
