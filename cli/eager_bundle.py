"""Reproduction bundles of an eager layer's failure: files a maintainer runs without this project.

A bundle folder (one per cause of failure: a check that fails the same way as an earlier
check's bundle in the same folder, the same mode and cause with numbers aside, and for a wrong
output the same mask convention, points to that bundle instead) holds:

* ``replay.py``: one fixed script (:data:`~mha_verify.eager_replay.REPLAY`) that needs only torch
  and the layer's library; it builds the layer, makes the harness's call, prints expected vs
  actual and exits 1 while the bug is there;
* ``bundle.json``: data only: how the layer is built (its class, its constructor's arguments, its
  config's fields: :meth:`~mha_verify.properties.adapters.construction.Construction.recipe`), the
  dtype, the call (its arguments, tensors by name), the mode ("raises": the call raised where a
  tensor was owed; "differs": its output differs from the float64 oracle beyond ``allowed``), the
  check, the counterexample and the cause;
* ``tensors.pt``: the layer's weights as the harness drew them, the call's tensors and the float64
  oracle's output (``torch.save`` of tensors only, read back with ``weights_only=True``);
* ``README.txt``: what is wrong, the inputs, the one-line cause, and whether ``replay.py`` exited 1
  when the bundle was written (it is run once, in a fresh interpreter, to say so).

A failure the layer's plain call does not show (a relation between two calls, a gradient) gets
no bundle: the writer says why, and the check's own replay command stands.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mha_verify.eager_replay import REPLAY
from mha_verify.json_files import read_json
from mha_verify.mha.tolerance import compare
from mha_verify.properties.engine.measure import oracle
from mha_verify.properties.engine.results import CheckResult
from mha_verify.properties.strategies.examples import AttnExample
from mha_verify.properties.targets.eager import Target
from mha_verify.repro_bundle import safe_name
from mha_verify.sweep_rows import cause_of

#: a bundle.json holds the example's description, not its tensors (those are in tensors.pt)
MAX_BUNDLE_BYTES = 4 * 1024 * 1024

#: seconds the written replay.py may take to show the bug (it imports the layer's library)
REPLAY_TIMEOUT = 180


class _Unstorable(Exception):  # noqa: N818 -- a reason, said in place of a bundle
    """A call argument that is not a tensor, a number, a string, a bool, None or a tuple/list of them."""


def _encode(value: object, tensors: dict[str, torch.Tensor], path: str) -> object:
    if isinstance(value, torch.Tensor):
        tensors[f"call/{path}"] = value.detach().clone()
        return {"tensor": path}
    if isinstance(value, (tuple, list)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return {kind: [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise _Unstorable(f"its forward is called with a {type(value).__name__} ({path}), which a bundle cannot hold "
                      "as data")


_Calls = list[tuple[tuple[Any, ...], dict[str, Any]]]


def _record(module: nn.Module, call: Any) -> tuple[_Calls, object, BaseException | None]:
    """The calls of ``module``'s forward while ``call()`` runs, what it returned, what it raised."""
    calls: _Calls = []

    def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append((args, dict(kwargs)))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        try:
            with torch.no_grad():
                return calls, call(), None
        except Exception as exc:  # the failure may be that very call raising
            return calls, None, exc
    finally:
        handle.remove()


def write_eager_bundle(directory: str | Path, target: Target, result: CheckResult, ex: AttnExample,
                       dtype: torch.dtype) -> str:
    """Write the bundle of ``result``'s failure at ``ex`` under ``directory``; what was written, or
    why nothing was (a sentence either way, kept in the report)."""
    if target.plan is None:
        return "no bundle: the target is a factory, not a layer class the bundle can build by itself"
    if target.plan.core is not None:
        return ("no bundle: an attention core is verified inside projections the harness gives it, which a "
                "standalone replay does not have; its replay command reproduces the failure")
    s = ex.sizes
    bound = target.build(s.d_model, s.n_head, seed=ex.seed, dtype=dtype)
    calls, out, raised = _record(bound.module, lambda: bound(ex.q, ex.k, ex.v, ex.mask))
    if not calls:
        return "no bundle: the adapter did not reach the layer's forward on the counterexample"
    tensors: dict[str, torch.Tensor] = {}
    try:
        args, kwargs = calls[0]
        call = {"args": [_encode(a, tensors, f"arg{i}") for i, a in enumerate(args)],
                "kwargs": {k: _encode(v, tensors, k) for k, v in kwargs.items()}}
    except _Unstorable as exc:
        return f"no bundle: {exc}"
    if raised is not None:
        mode, allowed = "raises", 0.0
        expected = f"a tensor of shape {(s.batch, s.lq, s.d_model)} (the layer's output for these inputs)"
        cause = f"{type(raised).__name__}: {(str(raised).strip().splitlines() or [''])[0][:300]}"
    elif bound.conventions.beyond:  # a law broken between calls: the oracle, which does not model it, is no expectation
        return (f"no bundle: laws only (it takes {bound.conventions.beyond}): a standalone bundle holds one call "
                f"against the oracle, which does not model the layer; {result.name}'s replay command reproduces it")
    elif isinstance(out, torch.Tensor) and out.shape != (s.batch, s.lq, s.d_model):  # the output contract's breach
        ref, _, _ = oracle(bound, ex)
        mode, allowed = "differs", 0.0
        tensors["expected"] = ref.detach().double().clone()
        expected = f"the float64 oracle's output {tuple(ref.shape)} with the layer's weights"
        cause = f"output shape {tuple(out.shape)}, but should be (B, Lq, D) = {tuple(ref.shape)}"
    else:
        assert isinstance(out, torch.Tensor)
        ref, _, same = oracle(bound, ex)
        c = compare(out, ref, same, dtype)
        if c.ok:
            return (f"no bundle: the layer's plain call on the counterexample agrees with the float64 oracle "
                    f"(error {c.error:.3g}, allowed {c.allowed:.3g}); {result.name} fails on what it compares beyond "
                    "one call, so its replay command reproduces it")
        mode, allowed = "differs", float(c.allowed)
        tensors["expected"] = ref.detach().double().clone()
        expected = (f"the float64 oracle's output {tuple(ref.shape)} with the layer's weights, within {c.allowed:.3g} "
                    f"(the tolerance for {str(dtype).replace('torch.', '')})")
        cause = str(c)
    # an exception's message names its cause; a wrong number does not, so a wrong output under
    # another mask convention may be another bug and gets a bundle of its own
    key = [mode, cause_of(cause), "" if mode == "raises" else
           "no mask" if ex.mask is None else f"{ex.mask_spec.convention} mask"]
    earlier = _bundle_of_cause(Path(directory), key)
    if earlier is not None:
        # one cause, one bundle: ESM as cross-attention fails 20 checks on one view, and a
        # bundle each (its replay run once in a fresh interpreter, ~4.5 s) was 100 s of its 229 s
        return f"no new bundle: the same cause as the bundle {earlier} ({cause})"
    for name, t in bound.module.state_dict().items():
        tensors[f"weights/{name}"] = t.detach().clone()
    folder = Path(directory) / safe_name(f"{type(bound.module).__name__}.{result.name}")
    folder.mkdir(parents=True, exist_ok=True)
    library = type(bound.module).__module__.split(".")[0]
    bundle = {"check": result.name, "counterexample": result.counterexample or ex.describe(), "mode": mode,
              "allowed": allowed, "expected": expected, "dtype": str(dtype).replace("torch.", ""),
              "build": target.plan.recipe(s.d_model, s.n_head), "call": call, "cause": cause, "cause_key": key,
              "versions": {"torch": torch.__version__, library: _version(library)}}
    torch.save(tensors, folder / "tensors.pt")
    (folder / "bundle.json").write_text(json.dumps(bundle, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    (folder / "replay.py").write_text(REPLAY, encoding="utf-8")
    shown = _run_replay(folder)
    (folder / "README.txt").write_text(
        f"layer: {target.spec!a}, built as {target.built_as!a}\n"
        f"check: {result.name!a} failed: {(result.reason or '')[:2000]!a}\n"
        f"inputs: {bundle['counterexample']!a}\n"
        f"cause: {cause!a}\n"
        f"expected: {expected}\n"
        f"replay: python replay.py (needs torch and {library} only; reads bundle.json and tensors.pt; exit 1 while "
        f"the bug is there, 0 once it is gone, 2 if it cannot run here). {shown}\n",
        encoding="utf-8")
    return f"bundle {folder}: {shown}"


def _bundle_of_cause(directory: Path, key: list[str]) -> Path | None:
    """The bundle under ``directory`` of the cause ``key`` (the mode, the cause with its numbers
    masked by :func:`~mha_verify.sweep_rows.cause_of`, a wrong output's mask convention), if one is there."""
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("*/bundle.json")):
        try:  # a folder the user named: a bundle.json there may be anything
            doc = read_json(path, what=str(path), max_bytes=MAX_BUNDLE_BYTES)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("cause_key") == key:
            return path.parent
    return None


def _version(library: str) -> str:
    try:
        from importlib.metadata import version

        return version(library)
    except Exception:  # a library with no distribution metadata (a local package)
        return "unknown"


def _run_replay(folder: Path) -> str:
    """Run replay.py once in a fresh interpreter, as a maintainer would (in its folder, with this
    environment's packages): does it show the bug?"""
    try:
        done = subprocess.run([sys.executable, str(folder / "replay.py")], capture_output=True, text=True,
                              timeout=REPLAY_TIMEOUT, cwd=folder)
    except subprocess.TimeoutExpired:
        return f"When written, it ran past {REPLAY_TIMEOUT} s."
    last = (done.stdout.strip().splitlines() or [""])[-1][:300]
    if done.returncode == 1 and last.startswith("actual:"):
        return f"When written, it exited 1, showing the bug ({last})."
    said = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or [""])[-1][:300]
    return f"When written, it exited {done.returncode}, NOT showing the bug: {said}"
