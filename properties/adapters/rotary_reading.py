"""How a library layer lays out its rotary embeddings: halves or neighbouring pairs, and which
way they turn, read by running the library's own functions on a probe.

HF writes rotary in the layer's module as ``apply_rotary_pos_emb(q, k, cos, sin)``, usually
through ``rotate_half``; layers differ in the pairing (Llama's halves, GLM's and Helium's
neighbours, the PE encoders' complex product over neighbours through ``freqs_cis``) and, in one
case, in the direction (NanoChat's ``rotate_half`` returns ``cat(x2, -x1)``). Reading the source
text sees only the spellings one thought of; running these pure functions of tensors on a
probe, and matching the result against the four formulas of :class:`mha.rotary.Rotary`, sees
what they compute. A result that matches none is said, never guessed.

Which rotary a layer applies is read here too: the frequencies its HF config states
(:func:`rotary_of`), the library's own rotary module and its (cos, sin) for a probe, and the
``position_embeddings`` a layer is called with.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mha_verify.mha.rotary import Rotary
from mha_verify.properties.adapters.forward_source import forward_sources
from mha_verify.properties.adapters.layer_attrs import layer_type_of

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


def rotary_of(config: object, layer_type: str | None = None) -> tuple[Rotary | None, str]:
    """(the rotary embeddings an HF config describes, how we know) or (None, why not).

    transformers 5.x keeps them in ``rope_parameters`` (``rope_theta``, ``rope_type``,
    ``partial_rotary_factor``), 4.x in ``rope_theta`` and ``rope_scaling``. Only the default
    rope type is the formula of :class:`mha.rotary.Rotary`; scaled types (linear, dynamic, yarn,
    llama3, longrope) change the frequencies, and are left out (identity rotation) with a note.
    The layout is halves here; the layer's own is read by :func:`rotary_layout`.
    """
    theta, rope_type, fraction = _rope_parameters(config, layer_type)
    if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        return None, "rotary replaced by a rotation by 0: no rope_theta in its config"
    if rope_type not in (None, "default"):
        return None, f"rotary replaced by a rotation by 0: rope type {rope_type!r} is not the default formula"
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        return None, f"rotary replaced by a rotation by 0: partial_rotary_factor={fraction!r}"
    rotary = Rotary(float(theta), False, float(fraction))
    return rotary, f"{rotary.describe()} (its config)"


def _rope_parameters(config: object, layer_type: str | None) -> tuple[object, object, object]:
    """(rope_theta, rope_type, partial_rotary_factor) as an HF config states them (5.x's ``rope_parameters``,
    per layer type where it has them; 4.x's ``rope_theta`` and ``rope_scaling``), unchecked."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]  # Gemma 3: one set of rotary parameters per layer type
    if isinstance(params, dict) and "rope_theta" in params:
        return (params.get("rope_theta"), params.get("rope_type", "default"),
                params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
    scaling = getattr(config, "rope_scaling", None)
    rope_type = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else "default"
    return getattr(config, "rope_theta", None), rope_type, getattr(config, "partial_rotary_factor", 1.0)


def scaled_rope(module: nn.Module) -> tuple[Rotary, str] | None:
    """(the default formula at the config's base and fraction, the rope type) for a layer whose HF config
    names a rope type the oracle's formula does not compute, one of the frequency rules over positions
    0 .. L-1 its library declares (transformers' ``ROPE_INIT_FUNCTIONS``: llama3, yarn, linear, dynamic,
    longrope; not Pixtral's axial rope over a grid of patches, whose positions the harness does not give),
    where its library's own rotary class gives the layer its (cos, sin) on a probe; None elsewhere. Such a
    layer runs with its real rotary and is held by the laws alone: never by a rotation by 0 in place of its
    step."""
    config = getattr(module, "config", None)
    theta, rope_type, fraction = _rope_parameters(config, layer_type_of(module))
    if rope_type in (None, "default") or not isinstance(theta, (int, float)) or isinstance(theta, bool) \
            or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        return None
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return None
    if rope_type not in ROPE_INIT_FUNCTIONS:
        return None
    emb = library_rotary(module)
    if emb is None:
        return None
    try:
        with torch.no_grad():
            rotary_cos_sin(emb, module, torch.zeros(1, 3, 8), torch.arange(3)[None])
    except Exception:  # its rotary takes other positions (axial patches): not given, said by rotary_of
        return None
    return Rotary(float(theta), False, float(fraction)), str(rope_type)


def library_rotary(module: nn.Module) -> nn.Module | None:
    """The layer's library's own rotary embedding (``LlamaRotaryEmbedding(config)``: a class named
    ``*RotaryEmbedding`` in the layer's module), built from the layer's config; None if none
    builds. Its cos and sin are what the model would give the layer, so they are verified too.

    Built at every call, never kept: one built while an exporter traces holds fake tensors.
    """
    config = getattr(module, "config", None)
    namespace = vars(sys.modules.get(type(module).__module__, types.ModuleType("none")))
    candidates = sorted((c for name, c in namespace.items() if name.endswith("RotaryEmbedding")
                         and inspect.isclass(c) and issubclass(c, nn.Module)), key=lambda c: c.__name__)
    for cls in candidates if config is not None else ():
        try:
            return cls(config=config)
        except Exception:
            continue
    return None


def rotary_cos_sin(emb: nn.Module, module: nn.Module, x: torch.Tensor,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the library's rotary embedding ``emb`` for ``module``: with its layer type where
    the embedding's forward takes one (Gemma 3's ``forward(x, position_ids, layer_type)``)."""
    if "layer_type" in inspect.signature(emb.forward).parameters:
        cos, sin = emb(x, positions, layer_type_of(module))
    else:
        cos, sin = emb(x, positions)
    return cos, sin


def position_embeddings(module: nn.Module, x: torch.Tensor, rotary: Rotary | None,
                        head_dim: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``position_embeddings`` (cos, sin), each (B, L, r), for positions start .. start + L-1 of
    x (B, L, D) (start > 0: a chunk after the ones a KV cache holds): from the library's own rotary
    embedding where there is one, else in its layout (the angles repeated over both halves); a
    rotation by 0 where ``rotary`` is None."""
    if rotary is None:
        return identity_rotary(x, head_dim)
    B, L = x.shape[0], x.shape[1]
    positions = torch.arange(start, start + L, device=x.device)[None].expand(B, L)
    emb = library_rotary(module)
    if emb is not None:
        return rotary_cos_sin(emb, module, x, positions)
    r = rotary.dims(head_dim)
    inv_freq = 1.0 / rotary.base ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)  # (B, L, r/2)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def identity_rotary(x: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``position_embeddings`` (cos, sin) of a rotation by 0: RoPE leaves q and k unchanged.

    Rotary position encoding is outside the attention formula we verify; with cos = 1 and
    sin = 0, ``apply_rotary_pos_emb`` is the identity and the layer is plain attention.
    """
    B, L = x.shape[0], x.shape[1]
    return (torch.ones(B, L, head_dim, dtype=x.dtype, device=x.device),
            torch.zeros(B, L, head_dim, dtype=x.dtype, device=x.device))


__all__ = ["LAYOUTS", "cos_sin_batched", "identity_rotary", "library_rotary", "position_embeddings",
           "rotary_cos_sin", "rotary_layout", "rotary_of", "scaled_rope"]
