"""QK-norm read from a layer's own norm children, for the oracle to apply (:class:`mha.scoring.Norm`).

A layer that normalizes q and k before the scores (Qwen3, Gemma 3, OLMo 2, Chameleon, Cohere,
diffusers' ``qk_norm``) holds them as children named in
:data:`mha_verify.properties.adapters.recognition.QK_NORM_PAIRS`. What each computes is decided by its shape and
a probe against the closed set of formulas the oracle knows (RMSNorm, LayerNorm or an L2 norm, weight w or
1 + w), not by its class name: a norm of any other form is refused with its reason, never guessed —
unless the layer's library declares the norm (:func:`adapters.spec.declared_norm`: a transformers
config's ``rms_norm_eps``): the declared norm is then what the oracle applies, and the child's
departure from it is named in every failure against the oracle.
The probe runs the norm alone on a random input; the attention around it is what the properties
then verify (where the layer applies it, before the split or per head, and before rotary).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from mha_verify.mha.scoring import NORM_KINDS, Norm
from mha_verify.properties.adapters import recognition
from mha_verify.properties.adapters.spec import declared_norm

_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")
#: the epsilons a norm that states none is tried with (0: F.normalize's clamp at 1e-12 on the norm)
_UNSTATED_EPS = (0.0, 1e-5, 1e-6, 1e-8)


#: a layer's norms, read once: its adapter asks on every call, an exporter's trace included, where
#: a probe (a data-dependent comparison) cannot run. The Norms hold the live parameters.
Norms = tuple[Norm | None, Norm | None, Norm | None]
_READ: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, int, int], Norms]] = weakref.WeakKeyDictionary()
#: a layer's norm children that compute no formula of the oracle's, where its library declares one: the
#: departure in words, per layer (read with its norms)
_DEPARTED: weakref.WeakKeyDictionary[nn.Module, tuple[str, ...]] = weakref.WeakKeyDictionary()


def norm_departures(module: nn.Module) -> tuple[str, ...]:
    """Where ``module``'s QK-norm children depart from the norm its library declares (read by :func:`qk_norms`)."""
    return _DEPARTED.get(module, ())


def qk_norms(module: nn.Module, n_head: int, head_dim: int, n_kv: int) -> Norms:
    """(q norm, k norm, v norm) of ``module``, each None where it has no such child.

    ValueError naming the child when one is present but of no form the oracle applies."""
    sizes = (n_head, head_dim, n_kv)
    hit = _READ.get(module)
    if hit is not None and hit[0] == sizes:
        return hit[1]
    norms = _read(module, n_head, head_dim, n_kv)
    _READ[module] = (sizes, norms)
    return norms


def _read(module: nn.Module, n_head: int, head_dim: int, n_kv: int) -> Norms:
    declared = declared_norm(module)
    departed: list[str] = []
    found: dict[str, Norm] = {}
    names = [(which, name, heads) for q, k in recognition.QK_NORM_PAIRS for which, name, heads in
             (("q", q, n_head), ("k", k, n_kv))] + [("v", v, n_kv) for v in recognition.V_NORMS]
    for which, name, heads in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module) and not isinstance(child, nn.Identity) and which not in found:
            found[which] = read_norm(child, f"{type(module).__name__}.{name}", heads, head_dim, declared, departed)
    _DEPARTED[module] = tuple(departed)
    return found.get("q"), found.get("k"), found.get("v")


def read_norm(norm: nn.Module, name: str, n_heads: int, head_dim: int,
              declared: tuple[str, float, str] | None = None, departed: list[str] | None = None) -> Norm:
    """The :class:`Norm` that ``norm`` computes on the projection of ``n_heads`` heads of ``head_dim``.

    ``declared``: (kind, eps, in words) of the norm its library declares; where ``norm`` computes no formula
    the oracle knows, that norm is returned (its weight w), and the departure is appended to ``departed``."""
    weight = _tensor(norm, "weight")
    bias = _tensor(norm, "bias")
    if weight is None and bias is None:  # vit-pytorch's RMSNorm: its one parameter is the gain (gamma, g)
        weight = _sole_parameter(norm)
    heads_first = weight is not None and tuple(weight.shape) == (n_heads, 1, head_dim)
    if heads_first:  # (H, 1, Hd): one row per head, broadcast over (B, H, L, Hd); a view stays live
        weight = weight.view(n_heads, head_dim)  # type: ignore[union-attr]
    places: dict[str, tuple[int, ...]] = {"head": (head_dim,), "all": (n_heads * head_dim,)}
    if weight is None:  # where it normalizes: its normalized_shape, else whichever the probe confirms
        width = _normalized_width(norm)
        wheres = [o for o, shape in places.items() if width in (-1, shape[0])]
        what = f"normalized_shape {width}"
    elif weight.dim() == 2 and tuple(weight.shape) == (n_heads, head_dim):
        wheres, places["head"] = ["head"], (n_heads, head_dim)  # one row per head (Chameleon, Cohere)
    else:
        wheres = [o for o, shape in places.items() if tuple(weight.shape) == shape]
        what = f"a weight of shape {tuple(weight.shape)}"
    if not wheres:
        raise ValueError(f"{name} has {what}: neither one head ({head_dim}) nor all {n_heads} heads "
                         f"({n_heads * head_dim}), a QK-norm the oracle cannot place")
    eps = next((float(v) for a in _EPS_ATTRS if isinstance(v := getattr(norm, a, None), (int, float))
                and not isinstance(v, bool)), None)
    said = [getattr(norm, a) for a in _EPS_ATTRS if a in vars(norm)]  # an epsilon attribute, if any
    if eps is None and said and said[0] is not None:  # stated, but neither a number nor None
        raise ValueError(f"{name} ({type(norm).__name__}) states its epsilon as {said[0]!r}, not a number")
    if eps is not None and not math.isfinite(eps):
        raise ValueError(f"{name} ({type(norm).__name__}) states a non-finite epsilon ({eps})")
    # no epsilon attribute (F.normalize(x) * sqrt(d) * gamma; F.layer_norm's default), or None (torch's
    # nn.RMSNorm: the input dtype's epsilon): the first of the usual ones the probe confirms at inputs
    # small enough that each differs from the next
    epsilons: tuple[float | None, ...] = (eps,) if eps is not None else \
        (None, *_UNSTATED_EPS) if said else (*_UNSTATED_EPS, None)
    candidates = [(Norm(kind, over, e, weight, bias, offset), places[over]) for e in epsilons
                  for over in wheres for kind in NORM_KINDS for offset in (0.0, 1.0) if not (offset and weight is None)]
    matches = [c for c, shape in candidates if _computes(norm, c, shape, heads_first)]
    if not matches and declared is not None and departed is not None:
        kind, declared_eps, how = declared
        departed.append(f"its {name} ({type(norm).__name__}) computes neither RMSNorm, LayerNorm nor an L2 norm on "
                        f"a probe where its spec says {how}")
        return Norm(kind, wheres[0], declared_eps, weight, bias, 0.0)
    if not matches:
        raise ValueError(f"{name} ({type(norm).__name__}) computes neither RMSNorm, LayerNorm nor an L2 norm "
                         "(weight w or 1 + w) on a probe: a QK-norm the oracle does not model")
    return matches[0]


def _tensor(norm: nn.Module, attr: str) -> torch.Tensor | None:
    value = getattr(norm, attr, None)
    return value if isinstance(value, torch.Tensor) else None


def _sole_parameter(norm: nn.Module) -> torch.Tensor | None:
    """The one parameter of a norm, its children holding none (LookViT's ``LayerNorm``: an affine-free
    ``nn.LayerNorm`` child and a gain ``gamma``)."""
    params = list(norm.parameters())
    return params[0] if len(params) == 1 and any(p is params[0] for p in norm.parameters(recurse=False)) else None


def _normalized_width(norm: nn.Module) -> int:
    shape = getattr(norm, "normalized_shape", None)
    if isinstance(shape, int):
        return shape
    if isinstance(shape, (tuple, list)) and shape and all(isinstance(s, int) for s in shape):
        return math.prod(shape)
    return -1


def _computes(norm: nn.Module, formula: Norm, shape: tuple[int, ...], heads_first: bool = False) -> bool:
    """Whether ``norm`` computes ``formula`` on a random input (2, 3, *shape) of its dtype, to within
    a few roundings of that dtype, at unit scale and at 1e-4 (where an epsilon shows); the norm's
    gradients and modes are left as they were. One row per head: the input is (2, 3, H, Hd), or
    (2, H, 3, Hd) where ``heads_first`` (a gain of shape (H, 1, Hd))."""
    param = next(iter(norm.parameters()), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    rows_per_head = len(shape) == 2
    draw = (2, shape[0], 3, shape[1]) if heads_first else (2, 3, *shape)
    base = torch.randn(*draw, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3 + 0.5
    for x in (base, base * 1e-4):
        with torch.no_grad():
            try:
                got = norm(x.to(dtype))
            except Exception:  # a norm that refuses a plain tensor is of no form we know
                return False
            if not isinstance(got, torch.Tensor) or got.shape != x.shape:
                return False
            flip = rows_per_head and not heads_first  # the formula takes (2, H, 3, Hd) for one row per head
            # an epsilon of the input's dtype is the probe dtype's here, not float64's
            exact = dataclasses.replace(formula, eps=formula.eps_for(dtype))
            want = exact.apply(x.transpose(-3, -2) if flip else x)
            want = want.transpose(-3, -2) if flip else want
        # layers compute norms in float32 at least (HF's RMSNorm upcasts, and downcasts float64): the
        # probe asks which formula, not how precisely (gradcheck and oracle_agreement judge that)
        tol = 64 * max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps) * (1 + float(want.abs().max()))
        if not bool((got.double() - want).abs().max() <= tol):
            return False
    return True


class PreNorms(NamedTuple):
    """The norms a layer applies to its inputs before the projections (:func:`input_norms`)."""

    norm: Norm  # the queries' input's
    context_norm: Norm | None  # the keys' and values' input's; None: the context is projected raw
    names: str  # the norm children, as the conventions quote them
    self_only: str = ""  # why the layer is verified as self-attention only, at this construction


#: per module, per context name (None: the layer verified as self-attention)
_INPUT_READ: weakref.WeakKeyDictionary[nn.Module, dict[str | None, PreNorms | None]] = weakref.WeakKeyDictionary()


def input_norms(module: nn.Module, source: str, input_name: str, context_name: str | None) -> PreNorms | None:
    """The norms ``module``'s forward ``source`` applies to its inputs before the projections, or None
    where it applies none the oracle can place. vit-pytorch's forms, read from the source:

    * ``x = self.norm(x)`` (or ``normed = self.norm(x)``, x not used again) in a self-attention layer:
      the same norm for queries, keys and values;
    * then in a cross-attention layer, ``context = default(context, x)`` (``context if ... else x``):
      the context projected raw (None for keys and values: the harness always passes it);
      ``context = self.norm_context(context) if exists(context) else x``: the context's own norm;
    * the context's own norm None at this construction (``nn.LayerNorm(dim) if cross_attend else
      None``): the layer takes no context as built, and is verified as self-attention;
    * the context joined to the normalized input as keys (``torch.cat((x, context))``, XCiT): keys of
      two kinds, verified as the self-attention it computes without a context; under a flag of the
      forward that is off by default (``if kv_include_self:``) the join is not taken at all.

    Each norm is a LayerNorm or RMSNorm over D (:func:`read_norm`, its probe). Read once per module (a
    probe cannot run in a trace)."""
    read = _INPUT_READ.setdefault(module, {})
    if context_name not in read:
        read[context_name] = _read_input_norms(module, source, input_name, context_name)
    return read[context_name]


def _read_input_norms(module: nn.Module, source: str, input_name: str, context_name: str | None) -> PreNorms | None:
    x = re.escape(input_name)
    first = re.search(rf"\b(\w+)\s*=\s*self\.(\w+)\(\s*{x}\s*\)", source)
    if first is None:
        return None
    var, name = first.groups()
    norm = _pre_norm(module, name)
    rest = source[first.end():]
    if norm is None or (var != input_name and re.search(rf"\b{x}\b", rest)):
        return None  # not a norm, or the raw input is used besides its normalized copy
    if context_name is None:
        return PreNorms(norm, norm, name)
    c, v = re.escape(context_name), re.escape(var)
    joins = [m for m in re.finditer(rf"cat\(\s*[\(\[]\s*{v}\s*,\s*{c}\b|cat\(\s*[\(\[]\s*{c}\s*,\s*{v}\b", rest)
             if not _under_default_off_flag(module, rest, m.start())]
    if joins:
        return PreNorms(norm, norm, name, f"{context_name} is concatenated to {var} as keys and values (keys of two "
                                          f"kinds): verified as the self-attention it computes without {context_name}")
    own = re.search(rf"\b{c}\s*=\s*self\.(\w+)\(\s*{c}\s*\)", rest)
    if own is not None:
        child = own.group(1)
        if hasattr(module, child) and getattr(module, child) is None:
            return PreNorms(norm, norm, name, f"its {context_name} norm ({child}) is None as built (a cross-attention "
                                              f"layer only when constructed so): verified as self-attention")
        context_norm = _pre_norm(module, child)
        return None if context_norm is None else PreNorms(norm, context_norm, f"{name}, {child}")
    if re.search(rf"default\(\s*{c}\s*,\s*{v}\s*\)|\b{c}\s+if\b[^\n]*\belse\s+{v}\b", rest):
        return PreNorms(norm, None, name)
    return None


def _under_default_off_flag(module: nn.Module, source: str, at: int) -> bool:
    """Whether position ``at`` of ``source`` lies in the body of ``if FLAG:``, FLAG a parameter of the
    forward whose default is False or None (XCiT's cross-ViT ``if kv_include_self:``): a path the
    harness, calling with defaults, never takes."""
    start = source.rfind("\n", 0, at) + 1
    indent = len(source[start:at]) - len(source[start:at].lstrip())
    for line in reversed(source[:start].splitlines()):
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#") or len(line) - len(stripped) >= indent:
            continue
        flag = re.fullmatch(r"if\s+(\w+)\s*:\s*(?:#.*)?", stripped.rstrip())
        if flag is None:
            return False
        try:
            param = inspect.signature(type(module).forward).parameters.get(flag.group(1))
        except (TypeError, ValueError):
            return False
        return param is not None and param.default in (False, None)
    return False


def _pre_norm(module: nn.Module, name: str) -> Norm | None:
    """Child ``name`` of ``module`` as a norm over all of D, or None where it is no norm child."""
    child = getattr(module, name, None)
    if not (isinstance(child, nn.Module) and type(child).__name__.endswith("Norm")):
        return None
    width = _normalized_width(child)
    if width <= 0:  # a norm of its own (vit-pytorch's RMSNorm, gain g): the width of its one gain
        gain = _sole_parameter(child)
        width = int(gain.shape[-1]) if gain is not None and gain.dim() == 1 else -1
    if width <= 0:
        rows = _ChannelsFirstNorm.of(child)
        if rows is None:
            return None
        try:  # a channels-first norm of another formula (a batch norm's statistics) stays unmodelled
            return dataclasses.replace(read_norm(rows, f"{type(module).__name__}.{name}", 1, rows.width), over="all")
        except ValueError:
            return None
    return dataclasses.replace(read_norm(child, f"{type(module).__name__}.{name}", 1, width), over="all")


class _ChannelsFirstNorm(nn.Module):
    """A norm of a channels-first feature map (B, C, H, W) whose parameters are all (1, C, 1, 1) (vit-pytorch's
    NesT ``LayerNorm`` and ScalableViT ``ChanLayerNorm``: gain ``g``, bias ``b``, statistics over dim 1) seen
    as a norm of rows (..., C), for :func:`read_norm`'s probe and the oracle: its gain and bias as (C,) views
    of the live parameters, its epsilon its own."""

    def __init__(self, norm: nn.Module, params: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.inner = norm
        self.width = int(params[0].shape[1])
        named: dict[str, torch.Tensor] = dict(norm.named_parameters(recurse=False))
        gain = next((named[n] for n in ("weight", "g", "gamma", "scale") if n in named), None)
        shift = next((named[n] for n in ("bias", "b", "beta", "shift") if n in named), None)
        if gain is None and shift is None and len(params) == 1:
            gain = params[0]
        self.weight = None if gain is None else gain.view(-1)
        self.bias = None if shift is None else shift.view(-1)
        for attr in _EPS_ATTRS:
            if attr in vars(norm):
                setattr(self, attr, getattr(norm, attr))

    @staticmethod
    def of(norm: nn.Module) -> _ChannelsFirstNorm | None:
        params = list(norm.parameters(recurse=False))
        if not params or any(True for _ in norm.children()) or any(
                p.dim() != 4 or p.shape[0] != 1 or p.shape[2:] != (1, 1) or p.shape[1] != params[0].shape[1]
                for p in params):
            return None
        return _ChannelsFirstNorm(norm, params)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # (N, C) -> a map (1, C, N, 1) -> back
        return self.inner(rows.t()[None, :, :, None])[0, :, :, 0].t().reshape(x.shape)
