"""Load what a user names on the command line: ``package.module:Attr`` or ``path/to/file.py:Attr``."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

from mha_verify.properties.protocol import TargetError
from mha_verify.properties.stand_ins import CUDA_ONLY_WHEELS, missing_wheel, standing_in


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
            how = f"with its packages' __init__ skipped ({'' if alone is None else alone.__file__})"
            missing = missing_wheel(exc)
            if alone is None and missing is not None:
                alone = _with_stand_ins(where)
                how = (f"with {', '.join(CUDA_ONLY_WHEELS)} as stand-ins that raise when called (their PyPI wheels do "
                       "not load with the CPU torch; an attention layer that calls them fails there, naming them)")
            if alone is None:
                raise TargetError(f"cannot import {where!r}: {type(exc).__name__}: {exc}{_hint(exc)}") from None
            module = alone
            print(f"mha-verify: note: importing {where!r} failed ({type(exc).__name__}: {exc}); it was imported "
                  f"{how}", file=sys.stderr)
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{where!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _with_stand_ins(where: str) -> types.ModuleType | None:
    """``where`` imported with torchvision and torchaudio standing in (:mod:`stand_ins`), whole or with its
    packages' ``__init__`` skipped; None where it fails so too (it subclasses what it imports, say)."""
    with standing_in():
        try:
            return importlib.import_module(where)
        except (Exception, SystemExit):
            for name in [n for n in sys.modules if n == where.split(".")[0] or n.startswith(where.split(".")[0] + ".")]:
                del sys.modules[name]
            return _module_alone(where)


def _hint(exc: BaseException) -> str:
    """What to do where the import failed on torchvision or torchaudio (many libraries import them in
    their package's __init__ only, for transforms their attention layers never use)."""
    missing = missing_wheel(exc)
    if missing is None:
        return ""
    return (f"; PyPI's {missing} for torch 2.13 is a CUDA build that does not load with the CPU torch: install the "
            f"CPU build (pip install {missing} --index-url https://download.pytorch.org/whl/cpu) or name the "
            "layer's file, path/to/module.py:Class")


def _module_alone(where: str) -> types.ModuleType | None:
    """``where`` (a dotted module) imported with its parent packages' ``__init__`` skipped, where the
    package failed to import (vit-pytorch's and segment-anything's import torchvision; their layers'
    files import torch, einops and their siblings only): each parent is a bare package over its folder,
    so the module's relative and absolute imports of siblings still resolve. None where the file is
    not found or fails this way too (it imports what failed itself, or a name a parent's __init__
    defines): the package's error is then the one to report."""
    parts = where.split(".")
    if len(parts) < 2:
        return None
    top = parts[0]
    folder = next((Path(f or ".") for f in sys.path
                   if Path(f or ".", top, "__init__.py").is_file()
                   and (Path(f or ".", *parts).with_suffix(".py").is_file()
                        or Path(f or ".", *parts, "__init__.py").is_file())), None)
    if folder is None:
        return None
    ours = [n for n in sys.modules if n == top or n.startswith(top + ".")]
    saved = {n: sys.modules.pop(n) for n in ours}  # a half-imported package would shadow the bare ones
    for i in range(1, len(parts)):
        name, path = ".".join(parts[:i]), str(folder.joinpath(*parts[:i]))
        bare = types.ModuleType(name)
        bare.__path__ = [path]
        bare.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        bare.__spec__.submodule_search_locations = [path]
        sys.modules[name] = bare
        if i > 1:
            setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], bare)
    try:
        return importlib.import_module(where)
    except (Exception, SystemExit):
        for n in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[n]
        sys.modules.update(saved)
        return None
