"""The replay script of an eager reproduction bundle (:mod:`mha_verify.eager_bundle`), as text.

One fixed script for every bundle: it needs torch and the layer's own library, never mha_verify,
and reads everything about the failure from ``bundle.json`` and ``tensors.pt`` as data. Names it
imports are checked to be dotted Python names; tensors load with ``weights_only=True``; nothing
read from the bundle is evaluated.
"""

from __future__ import annotations

REPLAY = '''"""Replay of a failure mha-verify found in an attention layer: needs only torch and the layer's
own library. It builds the layer as the harness built it (bundle.json's "build", the weights in
tensors.pt), makes the one call the harness made (bundle.json's "call"), prints what was expected
and what came. Exit 1: the bug is there; 0: it is gone; 2: the bundle could not be replayed here
(a library missing, a file damaged): not a verdict."""
import importlib
import json
import re
import sys
import types
from pathlib import Path

import torch

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*")
CONFIGS = ("PretrainedConfig", "PreTrainedConfig")  # the library configs the harness builds layers with
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
here = Path(__file__).resolve().parent


def named(module, name):
    for part in (module, name):
        if not isinstance(part, str) or not NAME.fullmatch(part):
            raise ValueError(f"bundle.json: {part!r} is not a dotted Python name")
    found = importlib.import_module(module)
    for attr in name.split("."):
        found = getattr(found, attr)
    return found


def a_class(found, bases, what):
    """``found`` if it is a class with one of ``bases`` (by name) in its MRO: the bundle calls
    nothing else (a hostile bundle.json naming os.system would otherwise run it)."""
    if not isinstance(found, type) or not any(b.__name__ in bases for b in found.__mro__):
        raise ValueError(f"bundle.json: the {what} {found!r} is not a subclass of {' or '.join(bases)}")
    return found


class OthersNone(types.SimpleNamespace):
    """A config namespace whose fields not written read None (the layer's options off)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def scalar(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"bundle.json: {value!r} is not a number, a string, a bool or null")


def argument(value, tensors):
    if isinstance(value, dict) and set(value) == {"tensor"}:
        return tensors["call/" + str(value["tensor"])]
    if isinstance(value, dict) and set(value) == {"tuple"}:
        return tuple(argument(v, tensors) for v in value["tuple"])
    if isinstance(value, dict) and set(value) == {"list"}:
        return [argument(v, tensors) for v in value["list"]]
    return scalar(value)


def setup():
    """The bundle, its tensors, the layer and its call, from bundle.json and tensors.pt."""
    bundle = json.loads((here / "bundle.json").read_text(encoding="utf-8"))
    tensors = torch.load(here / "tensors.pt", weights_only=True)
    build = bundle["build"]
    kwargs = {str(k): argument(v, tensors) for k, v in build.get("kwargs", {}).items()}
    config = build.get("config")
    if config is not None:
        if "namespace" in config:
            fields = {str(k): scalar(v) for k, v in config["namespace"].items()}
            made = OthersNone(**fields) if config.get("others_none") is True else types.SimpleNamespace(**fields)
        else:
            made = a_class(named(config["module"], config["class"]), CONFIGS, "config")()
            for field, value in config["set"].items():
                setattr(made, str(field), scalar(value))
            if config.get("attn_implementation") is not None:
                made._attn_implementation = str(config["attn_implementation"])
        kwargs[str(config["param"])] = made
    layer_class = a_class(named(build["module"], build["class"]), ("Module",), "layer")
    if not issubclass(layer_class, torch.nn.Module):
        raise ValueError(f"bundle.json: the layer {layer_class!r} is not a torch.nn.Module")
    layer = layer_class(*[scalar(a) for a in build.get("args", [])], **kwargs)
    layer = layer.to(DTYPES[bundle["dtype"]])
    layer.load_state_dict({k[len("weights/"):]: v for k, v in tensors.items() if k.startswith("weights/")},
                          strict=True)
    layer.eval()
    args = [argument(a, tensors) for a in bundle["call"]["args"]]
    kw = {str(k): argument(v, tensors) for k, v in bundle["call"]["kwargs"].items()}
    return bundle, tensors, layer, args, kw


def first_tensor(out):
    while not isinstance(out, torch.Tensor):
        if isinstance(out, (tuple, list)) and out:
            out = out[0]
        elif hasattr(out, "to_tuple"):
            out = out.to_tuple()
        else:
            print(f"the layer returned {type(out).__name__}, with no tensor first", file=sys.stderr)
            sys.exit(2)
    return out


def shown(value):
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(shown(v) for v in value) + ")"
    return repr(value)


try:
    bundle, tensors, layer, args, kw = setup()
except Exception as exc:
    print(f"could not build the layer or its call: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(2)
build = bundle["build"]
print(f"layer: {build['module']}.{build['class']} in {bundle['dtype']} (torch {torch.__version__})")
print("check:", bundle["check"], "-", bundle["counterexample"])
print("call:", ", ".join([shown(a) for a in args] + [f"{k}={shown(v)}" for k, v in kw.items()]))
print("expected:", bundle["expected"])
try:
    with torch.no_grad():
        out = layer(*args, **kw)
except Exception as exc:
    print(f"actual: raised {type(exc).__name__}: {exc}")
    sys.exit(1)
if bundle["mode"] == "raises":
    print(f"actual: returned a tensor of shape {tuple(first_tensor(out).shape)}: the bug is gone")
    sys.exit(0)
expected = tensors["expected"]
got = first_tensor(out).detach().double()
if got.numel() == expected.numel():
    got = got.reshape(expected.shape)
if got.shape != expected.shape:
    print(f"actual: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    sys.exit(1)
diff = (got - expected).abs().nan_to_num(float("inf"))
error, allowed = float(diff.max()), float(bundle["allowed"])
worst = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
print(f"actual: max error {error:.3g} against the float64 oracle (allowed {allowed:.3g}) at {worst}: "
      f"expected {float(expected[worst]):.6g}, got {float(got[worst]):.6g}")
sys.exit(1 if error > allowed else 0)
'''
