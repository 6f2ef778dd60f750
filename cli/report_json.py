"""The JSON report: every check with its verdict, plus the versions and providers used."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from mha_verify import __version__
from mha_verify.properties.engine.results import KINDS, VERDICTS, CheckResult


def versions() -> dict[str, str]:
    """The versions of the packages a verdict depends on."""
    out = {"python": platform.python_version(), "mha-verify": __version__}
    for dist in ("torch", "onnx", "onnxruntime", "onnxscript", "hypothesis", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def providers() -> list[str]:
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except Exception:  # onnxruntime missing or broken: the report says so instead of failing
        return []


def document(results: Sequence[CheckResult], *, target: str, profile: str, seed: int | None,
             shard: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report; ``shard`` (a part of a sharded run, see :mod:`mha_verify.merge`) is kept as given."""
    verdicts = {v: sum(r.verdict == v for r in results) for v in VERDICTS}
    kinds = {k: sum(r.kind == k for r in results) for k in KINDS}
    out: dict[str, Any] = {
        "tool": "mha-verify",
        "target": target,
        "profile": profile,
        "seed": seed,
        "verdict": "fail" if verdicts["fail"] else "pass",
        "counts": verdicts,
        "kinds": kinds,
        "versions": versions(),
        "providers": providers(),
        "results": [r.to_json() for r in results],
    }
    if shard is not None:
        out["shard"] = shard
    return out


def dumps(results: Sequence[CheckResult], *, target: str, profile: str, seed: int | None,
          shard: dict[str, Any] | None = None) -> str:
    return json.dumps(document(results, target=target, profile=profile, seed=seed, shard=shard), indent=2) + "\n"
