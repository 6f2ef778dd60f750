"""The build stage of a sweep, as a worker: ``python -m mha_verify.sweep_build``.

Reads one target spec per line on stdin; for each, loads it as ``check`` would (import, build
with no user code, one forward: :func:`properties.targets.load_target`) and writes one JSON line
on stdout: ``{"spec", "built", "built_as", "conventions", "reason", "seconds"}``. The parent
(:mod:`mha_verify.sweep`) gives each class a time limit and starts a new worker after one
that hangs or crashes, so that such a class is a row, not the end of the sweep.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a layer built from its config needs no download


def build_one(spec: str) -> dict[str, object]:
    from mha_verify.properties.protocol import TargetError
    from mha_verify.properties.targets.eager import PROBE_SIZES, load_target

    start = time.perf_counter()
    row: dict[str, object] = {"spec": spec, "built": False, "built_as": "", "conventions": "", "reason": ""}
    try:
        target = load_target(spec)
        row.update(built=True, built_as=target.built_as,
                   conventions=target.build(*PROBE_SIZES).conventions.describe())
    except TargetError as exc:
        row["reason"] = str(exc)
        wrapped = _wrapped(spec) if "no adapter recognizes" in str(exc) else []
        if wrapped:
            row.update(wraps=wrapped, reason=f"wraps {', '.join(wrapped)} (found on its own) with what the "
                                            "contract does not have (a residual, a norm, an output block)")
    except (Exception, SystemExit) as exc:  # a library's own error outside our checks: still one row
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        row["reason"] = f"{type(exc).__name__}: {first}"
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def _wrapped(spec: str) -> list[str]:
    """The attention layers a class holds as direct children (``BertAttention`` holds
    ``BertSelfAttention`` and ``BertSelfOutput``: a residual and a LayerNorm around it)."""
    from mha_verify.properties.adapters import construction
    from mha_verify.properties.loading import load_attr
    from mha_verify.properties.targets.eager import PROBE_SIZES

    try:
        cls = load_attr(spec)
        module = construction.choose(cls, *PROBE_SIZES)[1](*PROBE_SIZES)  # type: ignore[arg-type]
        return sorted({type(c).__name__ for _, c in module.named_children() if type(c).__name__.endswith("Attention")})
    except Exception:
        return []


def main() -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # what the libraries print must not interleave with the JSON lines
    for line in sys.stdin:
        spec = line.strip()
        if spec:
            out.write(json.dumps(build_one(spec)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
