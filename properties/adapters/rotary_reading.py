"""How a library layer lays out its rotary embeddings: halves or neighbouring pairs, and which
way they turn, read by running the library's own functions on a probe.

HF writes rotary in the layer's module as ``apply_rotary_pos_emb(q, k, cos, sin)``, usually
through ``rotate_half``; layers differ in the pairing (Llama's halves, GLM's and Helium's
neighbours, the PE encoders' complex product over neighbours through ``freqs_cis``) and, in one
case, in the direction (NanoChat's ``rotate_half`` returns ``cat(x2, -x1)``). Reading the source
text sees only the spellings one thought of; running these pure functions of tensors on a
probe, and matching the result against the four formulas of :class:`mha.rotary.Rotary`, sees
what they compute. A result that matches none is said, never guessed.
"""

from __future__ import annotations

import functools
import re
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mha_verify.mha.rotary import Rotary
from mha_verify.properties.adapters.calling import forward_sources, library_rotary, rotary_cos_sin

#: (interleaved, reverse) of the four pairings and directions, in the order they are tried
LAYOUTS = ((False, False), (True, False), (False, True), (True, True))

_READ: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[bool, bool] | None, str]] = weakref.WeakKeyDictionary()
_BATCHED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def _namespace(module: nn.Module) -> dict[str, Any]:
    return vars(sys.modules.get(type(module).__module__, types.ModuleType("none")))


def _close(a: object, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5))


class _ProbeNotRunError(Exception):
    """The probe could not call the function as HF's (another signature, no rotary embedding)."""


def _by_apply(module: nn.Module, apply: Callable[..., Any], base: float) -> tuple[bool, bool] | None:
    """The layout whose rotation of a probe q and k (1, 1, 6, r) matches what the module's
    ``apply_rotary_pos_emb`` gives with the library's own cos and sin, or None (ran, matched none);
    :class:`_ProbeNotRunError` where it cannot be called so."""
    emb = library_rotary(module)
    if emb is None:
        raise _ProbeNotRunError("no rotary embedding class builds from its config")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 6, 8, generator=generator)
    cos, sin = rotary_cos_sin(emb, module, x, torch.arange(6)[None])  # (1, 6, r)
    r = cos.shape[-1]
    if r % 2 or r == 0:
        raise _ProbeNotRunError(f"its rotary embedding gives cos of width {r}")
    q, k = torch.randn(2, 1, 1, 6, r, generator=generator)
    try:
        got = apply(q, k, cos, sin)
    except Exception as e:
        raise _ProbeNotRunError(str(e)) from e
    if not isinstance(got, (tuple, list)) or len(got) < 2:
        raise _ProbeNotRunError("it does not return (q, k)")
    for interleaved, reverse in LAYOUTS:
        rotary = Rotary(base, interleaved, 1.0, reverse)
        if _close(got[0], rotary.apply(q)) and _close(got[1], rotary.apply(k)):
            return interleaved, reverse
    return None


def _by_rotate_half(fn: Callable[..., Any]) -> tuple[bool, bool] | None:
    """The layout of ``rotate_half`` (or GPT-J's ``rotate_every_two``) from its value on (1, 2, 3, 4):
    the rotation by a quarter turn that its pairing and direction give."""
    got = fn(torch.arange(1.0, 5.0))
    quarter = {(False, False): (-3, -4, 1, 2), (True, False): (-2, 1, -4, 3),
               (False, True): (3, 4, -1, -2), (True, True): (2, -1, 4, -3)}
    if not isinstance(got, torch.Tensor) or got.shape != (4,):
        return None
    return next((layout for layout, want in quarter.items() if torch.equal(got, torch.tensor(want, dtype=got.dtype))),
                None)


def cos_sin_batched(module: nn.Module) -> bool:
    """Whether the module's ``apply_rotary_pos_emb`` takes cos and sin with a batch axis, (B, L, r)
    as Llama's (which unsqueezes a head axis), rather than (L, r) as DINOv3's (which broadcasts
    them over batch and heads as they are): a probe of batch 2 and 3 heads tells them apart, as
    no shape is written down. True where there is no such function or neither shape runs.
    Read once per module: an exporter's trace never runs the probe."""
    if module in _BATCHED:
        return _BATCHED[module]
    apply = _namespace(module).get("apply_rotary_pos_emb")
    batched = True
    if callable(apply):
        # the forward may call it with its own unsqueeze_dim (Pixtral's 0: cos and sin (L, r))
        dims = {int(m) for _, source in forward_sources(module) for m in _UNSQUEEZE.findall(source)}
        if len(dims) == 1:
            apply = functools.partial(apply, unsqueeze_dim=dims.pop())
        q, k = torch.randn(2, 2, 3, 6, 4, generator=torch.Generator().manual_seed(0))
        angles = torch.arange(6.0)[:, None] * torch.tensor([1.0, 0.5, 1.0, 0.5])  # (6, 4)
        with torch.no_grad():
            batched = _runs(apply, q, k, angles.cos().expand(2, 6, 4), angles.sin().expand(2, 6, 4)) \
                or not _runs(apply, q, k, angles.cos(), angles.sin())
    _BATCHED[module] = batched
    return batched


_UNSQUEEZE = re.compile(r"apply_rotary_pos_emb\([^()]*\bunsqueeze_dim\s*=\s*(\d)")


def _runs(apply: Callable[..., Any], q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether ``apply(q, k, cos, sin)`` returns q and k rotated in their own shape."""
    try:
        got = apply(q, k, cos, sin)
    except Exception:
        return False
    return isinstance(got, (tuple, list)) and len(got) >= 2 and all(
        isinstance(t, torch.Tensor) and t.shape == q.shape for t in got[:2])


def rotary_layout(module: nn.Module, base: float) -> tuple[tuple[bool, bool] | None, str]:
    """((interleaved, reverse), how it was read), or (None, why not) where the module's functions
    exist and match no formula. A module with neither function gets halves, turning forward
    (HF's default), and says so. Read once per module: an exporter's trace never runs the probe."""
    if module in _READ:
        return _READ[module]
    namespace = _namespace(module)
    apply, half = namespace.get("apply_rotary_pos_emb"), namespace.get("rotate_half", namespace.get("rotate_every_two"))
    found: tuple[bool, bool] | None = None
    how, tried, ran = "", [], False
    with torch.no_grad():
        if callable(apply):
            tried.append("apply_rotary_pos_emb")
            try:
                found, how, ran = _by_apply(module, apply, base), "its apply_rotary_pos_emb on a probe", True
            except Exception:  # another signature or layout of cos and sin: rotate_half may still say
                found, ran = None, False
        # a function that ran and matched no formula is the answer; rotate_half would only hide it
        if not ran and callable(half):
            tried.append("rotate_half")
            try:
                found, how = _by_rotate_half(half), "its rotate_half on a probe"
            except Exception:
                found = None
    if found is not None:
        read: tuple[tuple[bool, bool] | None, str] = found, how
    elif tried:
        read = None, f"its {' and '.join(tried)} {'matches' if len(tried) == 1 else 'match'} no rotary formula " \
                     "(halves or neighbours, either way round)"
    else:
        read = (False, False), "no rotate_half in its module: halves assumed"
    _READ[module] = read
    return read


__all__ = ["LAYOUTS", "cos_sin_batched", "rotary_layout"]
