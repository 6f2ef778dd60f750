"""QK-norm read from a layer's own norm children, for the oracle to apply (:class:`mha.scoring.Norm`).

A layer that normalizes q and k before the scores (Qwen3, Gemma 3, OLMo 2, Chameleon, Cohere,
diffusers' ``qk_norm``) holds them as children named in
:data:`mha_verify.properties.adapters.recognition.QK_NORM_PAIRS`. What each computes is decided by its shape and
a probe against the closed set of formulas the oracle knows (RMSNorm, LayerNorm or an L2 norm, weight w or
1 + w), not by its class name: a norm of any other form is refused with its reason, never guessed.
The probe runs the norm alone on a random input; the attention around it is what the properties
then verify (where the layer applies it, before the split or per head, and before rotary).
"""

from __future__ import annotations

import dataclasses
import math
import re
import weakref

import torch
from torch import nn

from mha_verify.mha.scoring import NORM_KINDS, Norm
from mha_verify.properties.adapters import recognition

_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


#: a layer's norms, read once: its adapter asks on every call, an exporter's trace included, where
#: a probe (a data-dependent comparison) cannot run. The Norms hold the live parameters.
Norms = tuple[Norm | None, Norm | None, Norm | None]
_READ: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, int, int], Norms]] = weakref.WeakKeyDictionary()


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
    found: dict[str, Norm] = {}
    names = [(which, name, heads) for q, k in recognition.QK_NORM_PAIRS for which, name, heads in
             (("q", q, n_head), ("k", k, n_kv))] + [("v", v, n_kv) for v in recognition.V_NORMS]
    for which, name, heads in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module) and not isinstance(child, nn.Identity) and which not in found:
            found[which] = read_norm(child, f"{type(module).__name__}.{name}", heads, head_dim)
    return found.get("q"), found.get("k"), found.get("v")


def read_norm(norm: nn.Module, name: str, n_heads: int, head_dim: int) -> Norm:
    """The :class:`Norm` that ``norm`` computes on the projection of ``n_heads`` heads of ``head_dim``."""
    weight = _tensor(norm, "weight")
    bias = _tensor(norm, "bias")
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
    if eps is None or not math.isfinite(eps):
        raise ValueError(f"{name} ({type(norm).__name__}) states its epsilon in no attribute we know "
                         f"({', '.join(_EPS_ATTRS)})")
    candidates = [(Norm(kind, over, eps, weight, bias, offset), places[over]) for over in wheres
                  for kind in NORM_KINDS for offset in (0.0, 1.0) if not (offset and weight is None)]
    matches = [c for c, shape in candidates if _computes(norm, c, shape)]
    if not matches:
        raise ValueError(f"{name} ({type(norm).__name__}) computes neither RMSNorm, LayerNorm nor an L2 norm "
                         "(weight w or 1 + w) on a probe: a QK-norm the oracle does not model")
    return matches[0]


def _tensor(norm: nn.Module, attr: str) -> torch.Tensor | None:
    value = getattr(norm, attr, None)
    return value if isinstance(value, torch.Tensor) else None


def _normalized_width(norm: nn.Module) -> int:
    shape = getattr(norm, "normalized_shape", None)
    if isinstance(shape, int):
        return shape
    if isinstance(shape, (tuple, list)) and shape and all(isinstance(s, int) for s in shape):
        return math.prod(shape)
    return -1


def _computes(norm: nn.Module, formula: Norm, shape: tuple[int, ...]) -> bool:
    """Whether ``norm`` computes ``formula`` on a random input (2, 3, *shape) of its dtype, to within
    a few roundings of that dtype; the norm's gradients and modes are left as they were."""
    param = next(iter(norm.parameters()), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    x = torch.randn(2, 3, *shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3 + 0.5
    with torch.no_grad():
        try:
            got = norm(x.to(dtype))
        except Exception:  # a norm that refuses a plain tensor is of no form we know
            return False
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            return False
        heads = x.transpose(-3, -2) if len(shape) == 2 else x  # (2, H, 3, Hd) for one row per head
        want = formula.apply(heads)
        want = want.transpose(-3, -2) if len(shape) == 2 else want
    # layers compute norms in float32 at least (HF's RMSNorm upcasts, and downcasts float64): the
    # probe asks which formula, not how precisely (gradcheck and oracle_agreement judge that)
    tol = 64 * max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps) * (1 + float(want.abs().max()))
    return bool((got.double() - want).abs().max() <= tol)


_INPUT_READ: weakref.WeakKeyDictionary[nn.Module, tuple[Norm, str] | None] = weakref.WeakKeyDictionary()


def input_norm(module: nn.Module, source: str, input_name: str) -> tuple[Norm, str] | None:
    """(the norm, its child's name) where ``module``'s forward ``source`` normalizes its input first,
    ``x = self.norm(x)`` (vit-pytorch's pre-norm inside the layer), with a LayerNorm or RMSNorm over D the
    oracle can apply; None where it does not. Read once per module (a probe cannot run in a trace)."""
    if module in _INPUT_READ:
        return _INPUT_READ[module]
    found = None
    pattern = re.compile(rf"\b{re.escape(input_name)}\s*=\s*self\.(\w+)\(\s*{re.escape(input_name)}\s*\)")
    for name in pattern.findall(source):
        child = getattr(module, name, None)
        if isinstance(child, nn.Module) and type(child).__name__.endswith("Norm") and _normalized_width(child) > 0:
            width = _normalized_width(child)
            norm = read_norm(child, f"{type(module).__name__}.{name}", 1, width)
            found = (dataclasses.replace(norm, over="all"), name)
            break
    _INPUT_READ[module] = found
    return found
