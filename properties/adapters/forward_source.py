"""What a layer's ``forward`` source text says: that it builds its own causal mask (a lower-triangular
buffer, SDPA's ``is_causal=True``), which query heads share a key/value head, read once per source;
the sources themselves, for the readers of library facts.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _lower_triangular(t: torch.Tensor) -> bool:
    if t.dim() < 2 or t.shape[-1] != t.shape[-2] or t.shape[-1] < 2 or t.dtype.is_complex:
        return False
    m = t.reshape(-1, t.shape[-2], t.shape[-1])[0] != 0
    return bool(torch.equal(m, torch.tril(torch.ones_like(m))))


_SDPA_CAUSAL = re.compile(r"is_causal\s*=\s*True")
# torch's bottom-right CausalBias (torch.nn.attention.bias), as a KV-cache decode step passes it to SDPA
_LOWER_RIGHT = re.compile(r"\bcausal_lower_right\s*\(")


_CAUSAL_SEEN: weakref.WeakKeyDictionary[nn.Module, tuple[bool | str, str]] = weakref.WeakKeyDictionary()


def detect_causal(module: nn.Module) -> tuple[bool | str, str]:
    """(causal, how we know) for ``module``, found once per instance (:func:`_detect_causal`).

    Cached: reading a buffer's values is data-dependent, which torch's exporters cannot
    trace, and a layer's structure does not change between calls.
    """
    if module not in _CAUSAL_SEEN:
        _CAUSAL_SEEN[module] = _detect_causal(module)
    return _CAUSAL_SEEN[module]


def _detect_causal(module: nn.Module) -> tuple[bool | str, str]:
    """(causal, how we know), from the layer's structure, never its outputs: causal is False, True
    (top-left aligned) or "bottom_right" (a forward that builds torch's ``causal_lower_right``).

    In order: a bool ``is_causal`` attribute (HF, torchtune), a bool ``causal`` attribute
    (x-transformers), a lower-triangular buffer (nanoGPT's ``bias`` on its slow path), a
    forward whose source calls SDPA with ``is_causal=True`` (nanoGPT's flash path), or a
    diffusers processor (``module.processor``) whose ``__call__`` does.
    """
    for attr in ("is_causal", "causal"):
        value = getattr(module, attr, None)
        if isinstance(value, bool):
            return value, f"causal from its {attr}={value} attribute"
    for name, buf in module.named_buffers(recurse=False):
        if _lower_triangular(buf):
            return True, f"causal from its lower-triangular buffer {name!r}"
    for where, source in forward_sources(module):
        if _LOWER_RIGHT.search(source):
            return "bottom_right", f"causal, bottom-right aligned, from causal_lower_right(...) in {where}"
        if _SDPA_CAUSAL.search(source):
            return True, f"causal from is_causal=True in {where}"
    return False, "not causal (no is_causal/causal attribute, no triangular buffer)"


# grouped-query heads: kv head i // g (torch's repeat_interleave, HF's repeat_kv, SDPA's enable_gqa) or
# i % Hkv (keys or values tiled: k.repeat(1, g, 1, 1), torch.tile(v, ...))
_INTERLEAVE = re.compile(r"\brepeat_kv\s*\(|\.repeat_interleave\s*\(|\benable_gqa\s*=\s*True")
_KV = r"\b(?:k|v|key|value|keys|values|key_states|value_states|kv|xk|xv)\w*"
_TILE = re.compile(_KV + r"\s*\.\s*(?:repeat|tile)\s*\(|\btorch\.tile\s*\(\s*" + _KV)


def detect_kv_map(module: nn.Module) -> tuple[str | None, str]:
    """(kv_map, how we know) from the layer's forward source: "interleave" where it calls
    ``repeat_kv`` / ``repeat_interleave`` / SDPA with ``enable_gqa=True``, "tile" where it repeats or
    tiles its keys or values; (None, "") where it says neither or both (the oracle's default then holds:
    interleave, HF's). A transformers layer repeats in its library's attention functions (``repeat_kv``),
    not in its forward: read from its modeling module."""
    found = set().union(*(_kv_kinds(source) for _, source in forward_sources(module)))
    if len(found) == 1:
        kind = found.pop()
        return kind, f"grouped-query heads {'interleaved' if kind == 'interleave' else 'tiled'} (its forward)"
    if not found and callable(getattr(inspect.getmodule(type(module)), "repeat_kv", None)):
        return "interleave", "grouped-query heads interleaved (repeat_kv of its modeling module)"
    return None, ""


@functools.lru_cache(maxsize=256)
def _kv_kinds(source: str) -> frozenset[str]:
    """The grouped-query mappings one source text names (read once per text: conventions are read at
    every call)."""
    return frozenset(kind for kind, pattern in (("interleave", _INTERLEAVE), ("tile", _TILE)) if pattern.search(source))


def causal_buffer_length(module: nn.Module) -> tuple[int, str] | None:
    """(N, what it is) for a layer whose own lower-triangular buffer (N, N) masks the future: it slices
    that buffer to the sequence, so it takes at most N positions (nanoGPT's ``bias`` of block_size)."""
    for name, buf in module.named_buffers(recurse=False):
        if _lower_triangular(buf):
            return int(buf.shape[-1]), f"its causal buffer {name!r} {tuple(buf.shape)}"
    return None


def own_causal_mask(module: nn.Module) -> bool:
    """Whether the layer masks the future itself with a lower-triangular buffer of its own (GPT-2's
    older code, ImageGPT's ``bias``), on top of any mask it is given."""
    return any(_lower_triangular(buf) for _, buf in module.named_buffers(recurse=False))


def forward_sources(module: nn.Module) -> tuple[tuple[str, str], ...]:
    """(where, source text) of the layer's forward and of a diffusers processor's ``__call__``
    (the layer's forward hands the work to it); "" where the source cannot be read. For a layer of a
    library the harness has no facts about, also the methods and functions of its own module that the
    forward names (whisper's ``self.qkv_attention``, a module-level ``attention(q, k, v, mask)``): the
    steps it takes are there."""
    processor = getattr(module, "processor", None)
    call = type(processor).__call__ if processor is not None and callable(processor) else None
    cls: type = type(module)
    return _sources(type(module).forward, call, _helpers(cls))


@functools.lru_cache(maxsize=256)
def _helpers(cls: type) -> tuple[tuple[str, Callable[..., Any]], ...]:
    """(where, function) of the methods and same-module functions ``cls.forward`` names, for classes
    of no library the harness knows (one level: what those call is not read)."""
    from mha_verify.properties.adapters.recognition import LIBRARY_FORMATS

    known = {library for library, _ in LIBRARY_FORMATS}
    if cls.__module__.split(".")[0] in {"torch", "mha_verify"} \
            or any(c.__module__.split(".")[0] in known for c in cls.__mro__):
        return ()
    try:
        source = inspect.getsource(getattr(cls, "forward"))  # noqa: B009 (a type, to mypy, has no forward)
    except (OSError, TypeError):
        return ()
    found: dict[str, tuple[str, Callable[..., Any]]] = {}
    if re.search(r"\bsuper\(\s*(\w+\s*,\s*self\s*)?\)\.forward\(", source):  # a twin's forward on its parent's
        parent = next((c for c in cls.__mro__[1:] if "forward" in vars(c)), None)
        if parent is not None and parent.__module__.split(".")[0] != "torch":
            found["super().forward"] = (f"{parent.__name__}.forward (its parent's)", vars(parent)["forward"])
            with contextlib.suppress(OSError, TypeError):
                source += "\n" + inspect.getsource(vars(parent)["forward"])
    namespace = vars(inspect.getmodule(cls) or object())
    for attr in re.findall(r"\bself\.(\w+)\s*\(", source):
        fn = inspect.getattr_static(cls, attr, None)
        if inspect.isfunction(fn) and attr != "forward":
            found.setdefault(attr, (f"its method {attr}", fn))
    for name in re.findall(r"(?<![.\w])(\w+)\b", source):
        fn = namespace.get(name)
        if inspect.isfunction(fn) and fn.__module__ == cls.__module__:
            found.setdefault(name, (f"{name} (its module's)", fn))
        elif inspect.isclass(fn) and issubclass(fn, torch.autograd.Function) and fn.__module__ == cls.__module__ \
                and callable(vars(fn).get("forward")):
            # a custom autograd Function (FlashAttentionFunction.apply(q, k, v, mask, ...)): its forward
            found.setdefault(name, (f"{name}.forward (its module's autograd Function)", vars(fn)["forward"]))
    return tuple(list(found.values())[:12])


@functools.lru_cache(maxsize=256)
def _sources(forward: Callable[..., Any], call: Callable[..., Any] | None,
             helpers: tuple[tuple[str, Callable[..., Any]], ...] = ()) -> tuple[tuple[str, str], ...]:
    """Read once per (forward, processor call): conventions are asked for at every call of a layer."""
    out = []
    for where, fn in (("its forward", forward), ("its processor", call), *helpers):
        try:
            out.append((where, inspect.getsource(fn) if fn is not None else ""))
        except (OSError, TypeError):
            out.append((where, ""))
    return tuple(out)
