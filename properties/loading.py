"""Load what a user names on the command line: ``package.module:Attr`` or ``path/to/file.py:Attr``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

from mha_verify.properties.protocol import TargetError


def load_attr(spec: str) -> object:
    """The object ``spec`` names: ``package.module:Attr`` (dotted attributes allowed) or
    ``path/to/file.py:Attr``; TargetError (a usage error) naming what is wrong.

    A file is imported under a private module name with its own folder on sys.path while it
    runs, so that it imports its siblings as ``python path/file.py`` would let it. A module that
    calls ``sys.exit()`` while it is imported is a TargetError too (a KeyboardInterrupt is the
    user's: it ends the run, exit code 130).
    """
    if ":" not in spec:
        raise TargetError(f"target {spec!r} must look like package.module:Attr or path/to/file.py:Attr")
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise TargetError(f"target {spec!r} must look like package.module:Attr or path/to/file.py:Attr")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise TargetError(f"target file {where!r} does not exist")
        name = f"_mha_verify_target_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise TargetError(f"target file {where!r} cannot be imported as Python")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        # the file's directory on sys.path while it is imported, so that it imports its siblings
        # (``from layers import Block`` next to model.py), as ``python path/file.py`` would allow
        folder = str(path.resolve().parent)
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        try:
            module_spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:  # sys.exit() at import must not end the gate green
            del sys.modules[name]
            raise TargetError(f"importing {where!r} failed: {type(exc).__name__}: {exc}") from None
        finally:
            if added and folder in sys.path:
                sys.path.remove(folder)
    else:
        try:
            module = importlib.import_module(where)
        except (Exception, SystemExit) as exc:
            alone = _module_alone(where) if isinstance(exc, (ImportError, RuntimeError)) else None
            if alone is None:
                raise TargetError(f"cannot import {where!r}: {type(exc).__name__}: {exc}{_hint(exc)}") from None
            module = alone
            print(f"mha-verify: note: importing {where!r} failed ({type(exc).__name__}: {exc}); its file "
                  f"{module.__file__} was loaded on its own, without its package's __init__", file=sys.stderr)
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{where!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


#: packages whose PyPI wheels for our torch are CUDA builds that do not load with the CPU torch
_CUDA_ONLY_WHEELS = ("torchvision", "torchaudio")


def _hint(exc: BaseException) -> str:
    """What to do where the import failed on torchvision or torchaudio (many libraries import them in
    their package's __init__ only, for transforms their attention layers never use)."""
    text = str(exc)
    missing = next((p for p in _CUDA_ONLY_WHEELS if p in text), None)
    if missing is None:
        return ""
    return (f"; PyPI's {missing} for torch 2.13 is a CUDA build that does not load with the CPU torch: install the "
            f"CPU build (pip install {missing} --index-url https://download.pytorch.org/whl/cpu) or name the "
            "layer's file, path/to/module.py:Class")


def _module_alone(where: str) -> types.ModuleType | None:
    """``where`` (a dotted module) loaded from its file without its package's ``__init__``, where the
    package failed to import (vit-pytorch's imports torchvision; its layers' files import torch and
    einops only); None where the file is not found or fails on its own too (a relative import, or it
    imports what failed itself: the package's error is then the one to report)."""
    parts = where.split(".")
    if len(parts) < 2 or where in sys.modules:
        return None
    for folder in sys.path:
        path = Path(folder or ".", *parts[:-1], parts[-1] + ".py")
        if not path.is_file():
            continue
        module_spec = importlib.util.spec_from_file_location(where, path)
        if module_spec is None or module_spec.loader is None:
            return None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[where] = module
        try:
            module_spec.loader.exec_module(module)
        except (Exception, SystemExit):
            del sys.modules[where]
            return None
        return module
    return None
