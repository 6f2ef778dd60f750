"""Projections read from what a layer shows where no naming of :data:`recognition.PROJECTIONS` fits:
the linear children its forward names, in the order it names them, and their weights' shapes.

Whisper's ``query/key/value/out``, lucidrains' ``to_q/to_kv/to_out`` (perceiver, conformer) and
``to_qkv/to_out`` (vit-pytorch), a ``ModuleList`` of q, k, v (and o) projections: no table row names
them all, and a new library would need a new row. What every one of them shows is the same:

* 2 projections: one (3 I, D) applied first (q, k, v chunked in that order), then one (D, I);
* 3 projections: (I, D), then (2 Ikv, Dc) (keys then values chunked: ``k, v = self.to_kv(c).chunk(2)``),
  then (D, I); or (2 I, D) named for q and k (``to_qk``: q then k chunked), (I, D) named for v, then (D, I);
* 4 projections: (I, D), (Ikv, Dc), (Ikv, Dc), (D, I): q, k, v, o in the order the forward names
  them, unless their names say which is which (``query``/``q``, ``key``/``k``, ``value``/``v``).

I is a multiple of the head count the layer shows (:mod:`head_count`). Anything else is
not recognized: the user's adapter says what it is. What the forward does between the projections
is the structural adapter's to read (its mask format, causality, layout, steps the oracle does not
model); this module only says which weights are q, k, v and o.
"""

from __future__ import annotations

import inspect
import re
import weakref

import torch
from torch import nn
from torch.nn.utils import parametrize

from mha_verify.mha.reference import MHAParams
from mha_verify.properties.adapters.head_count import head_count_source, n_head_of
from mha_verify.properties.adapters.position_steps import convolved_projections
from mha_verify.properties.adapters.projections import _linear_like, output_layer, weight_bias
from mha_verify.properties.adapters.structural import StructuralAdapter
from mha_verify.properties.adapters.unmodelled import is_gate
from mha_verify.properties.protocol import NotApplicable

_SELF_ATTR = re.compile(r"\bself\.(\w+)\b")
#: the role a projection's name states, by its tokens (``to_q``, ``query``, ``wq``, ``q_lin``)
_ROLE_TOKENS = {"q": {"q", "query", "queries", "wq"}, "k": {"k", "key", "keys", "wk"},
                "v": {"v", "value", "values", "wv"}}

#: the tokens of an output projection's name (``out_proj``, ``to_out``, ``wo``)
_OUT_TOKENS = {"out", "output", "wo", "o"}

Layer = tuple[str, nn.Module]  # (where: "to_q", "proj[1]"; the linear-like layer)


def called_projections(module: nn.Module, parameters: bool = False) -> list[Layer]:
    """The linear-like layers of ``module``'s children that its forward names, in the order of first
    mention: a child, the linear of a [Linear, Dropout...] block, the projection a convolution over
    positions follows (:mod:`position_steps`), the linear of an output block that ends in a norm, or
    each element of a ModuleList of linears; an nn.Identity (vit-pytorch's ``to_out`` with one head of
    width D) as itself; with ``parameters``, also a (out, in) Parameter of the layer's own named
    ``*weight`` (torch MHA's ``in_proj_weight``, applied with ``F.linear``) with its ``*bias`` as a linear."""
    children = {**(_parameter_linears(module) if parameters else {}), **dict(module.named_children())}
    convolved = convolved_projections(module)
    order: list[str] = []
    _mention_order(type(module), inspect.getattr_static(type(module), "forward", None), children, order, depth=0)
    out: list[Layer] = []
    for name in order:
        child = children[name]
        if isinstance(child, nn.ModuleList) and len(child) >= 2 and all(_linear_like(m) for m in child):
            out += [(f"{name}[{i}]", m) for i, m in enumerate(child)]
            continue
        layer = output_layer(child) or _wrapped_linear(child)
        if layer is None and name in convolved:  # Primer-EZ: the projection, then its convolution (a step)
            first = child[0]  # type: ignore[index]
            layer = output_layer(first) or _wrapped_linear(first)
        if layer is None:
            layer = _normed_output(name, child)
        if layer is not None:
            out.append((name, layer))
    return out


def _parameter_linears(module: nn.Module) -> dict[str, nn.Module]:
    """The layer's own 2-D ``*weight`` Parameters, each with its ``*bias`` (1-D, as many rows) where it has
    one, held by an nn.Linear that shares them: a redraw of the layer's weights reaches what is read."""
    own = dict(module.named_parameters(recurse=False))
    out: dict[str, nn.Module] = {}
    for name, weight in own.items():
        if weight.dim() != 2 or not name.endswith("weight"):
            continue
        bias = own.get(name[: -len("weight")] + "bias")
        holder = nn.Linear.__new__(nn.Linear)
        nn.Module.__init__(holder)
        holder.in_features, holder.out_features = int(weight.shape[1]), int(weight.shape[0])
        holder.weight = weight
        holder.bias = bias if bias is not None and tuple(bias.shape) == (weight.shape[0],) else None  # type: ignore[assignment]
        out[name] = holder
    return out


def _wrapped_linear(child: nn.Module) -> nn.Module | None:
    """The one linear of a projection wrapper (labml's ``PrepareForMultiHeadAttention``: a Linear, then
    a view into heads; normalized ViT's ``NormLinear``: a Linear whose weight is parametrized): a module with
    no parameters of its own and exactly one submodule, linear-like, besides its weight's parametrization;
    None for anything else (a LoRA wrapper's extra weights, a norm beside the linear)."""
    if isinstance(child, (nn.ModuleList, nn.Sequential)) or any(True for _ in child.parameters(recurse=False)):
        return None
    # a parametrization of the linear's weight (normalized ViT's ``NormLinear``: its weight L2-normalized by
    # ``parametrize``) computes the weight the linear applies, which ``weight`` gives: not a module of its own
    parts = {id(m) for owner in child.modules() if parametrize.is_parametrized(owner)
             and isinstance(found := getattr(owner, "parametrizations", None), nn.Module) for m in found.modules()}
    inner = [m for m in child.modules() if m is not child and id(m) not in parts]
    return inner[0] if len(inner) == 1 and _linear_like(inner[0]) else None


def _normed_output(name: str, child: nn.Module) -> nn.Module | None:
    """The linear of an output block named for one that normalizes what it projects (denoising-diffusion's
    ``to_out = Sequential(Conv2d(hidden, dim, 1), RMSNorm(dim))``): the norm is a step of its own, named
    with the layer's others; None for anything else."""
    if not _tokens(name) & _OUT_TOKENS or not isinstance(child, nn.Sequential) or len(child) != 2:
        return None
    first, norm = child
    return first if _linear_like(first) and type(norm).__name__.endswith("Norm") else None


_SELF_OR_SUPER = re.compile(r"\bself\.(\w+)\b|\bsuper\(\s*(?:\w+\s*,\s*self\s*)?\)\.(\w+)\(")


def _mention_order(cls: type, fn: object, children: dict[str, nn.Module], order: list[str], depth: int) -> None:
    """The children ``fn``'s source names, in order, into ``order``: a method of the layer it calls
    (``self.kv(context)``) or its parent's (``super().forward(...)``, ``super().kv(...)``) is read
    where it is called, so the projections come in the order they run."""
    if depth > 2 or not inspect.isfunction(fn):
        return
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return
    for hit in _SELF_OR_SUPER.finditer(source):
        name = hit.group(1)
        if name is None:  # super().method(...): the method of the next class up that defines it
            method = hit.group(2)
            owner = next((c for c in cls.__mro__ if any(v is fn for v in vars(c).values())), cls)
            parent = next((c for c in owner.__mro__[1:] if method in vars(c)), None)
            if parent is not None and parent.__module__.split(".")[0] != "torch":
                _mention_order(cls, vars(parent)[method], children, order, depth + 1)
        elif name in children:
            if name not in order:
                order.append(name)
        elif name != "forward":
            _mention_order(cls, inspect.getattr_static(cls, name, None), children, order, depth + 1)


def _shape(layer: nn.Module) -> tuple[int, int]:
    w, _ = weight_bias(layer)
    return int(w.shape[0]), int(w.shape[1])


def _tokens(where: str) -> set[str]:
    return set(re.split(r"[_\W\d]+", where.lower())) - {""}


def _role(where: str) -> str | None:
    tokens = _tokens(where)
    roles = [r for r, names in _ROLE_TOKENS.items() if tokens & names]
    return roles[0] if len(roles) == 1 else None


def _ordered_qkv(layers: list[Layer]) -> list[Layer]:
    """q, k, v of three same-role-candidate layers: by their names where each names a distinct role,
    else in the forward's order."""
    roles = [_role(where) for where, _ in layers]
    if sorted(r for r in roles if r) == ["k", "q", "v"]:
        return [layers[roles.index(r)] for r in ("q", "k", "v")]
    return layers


class Reading:
    """Which of a layer's projections are q, k, v (fused or not) and o: ``layout`` is "qkv" (one
    fused), "q_kv" (keys and values fused), "qk_v" (queries and keys fused) or "q_k_v"."""

    def __init__(self, layout: str, layers: list[Layer], identity_out: bool = False) -> None:
        self.layout, self.layers, self.identity_out = layout, layers, identity_out

    @property
    def projections(self) -> list[Layer]:
        """The layers whose weights are read: the output one left out where it is an identity."""
        return self.layers[:-1] if self.identity_out else self.layers

    def describe(self) -> str:
        names = ", ".join(where for where, _ in self.layers) + (" (an identity)" if self.identity_out else "")
        what = {"qkv": "one fused q, k, v projection and an output one",
                "q_kv": "a query projection, one fused key-value projection and an output one",
                "qk_v": "one fused query-key projection, a value projection and an output one",
                "q_k_v": "query, key, value and output projections"}[self.layout]
        return f"{what} ({names}), read from their shapes and the order its forward names them"


def read_projections(module: nn.Module) -> Reading | None:
    """The :class:`Reading` of ``module``'s projections, or None where its shapes fit none of the
    layouts in the module docstring: from its linear children, else with its own ``*weight`` Parameters
    too (only then: a table of its own named so, an (H, H) mixing, stays a step for the refusal)."""
    try:
        heads = n_head_of(module)
    except Exception:
        return None
    return _fit(_ungated(called_projections(module)), heads) \
        or _fit(_ungated(called_projections(module, parameters=True)), heads)


def _ungated(layers: list[Layer]) -> list[Layer]:
    """``layers`` without those named for a gate (vit-pytorch's ``to_gates``): no projection of q, k, v
    or the output, and a step the layer's conventions name (``Conventions.beyond``)."""
    return [(where, layer) for where, layer in layers if not is_gate(where.partition("[")[0])]


def _fit(layers: list[Layer], heads: int) -> Reading | None:
    """The reading of ``layers`` (in the order the forward names them) for ``heads`` heads, or None."""
    outs = [i for i, (where, _) in enumerate(layers) if _tokens(where) & _OUT_TOKENS]
    if len(outs) == 1 and outs[0] != len(layers) - 1:  # fair-esm's column attention names out_proj(v_proj(x)) first
        layers = [*(layer for i, layer in enumerate(layers) if i != outs[0]), layers[outs[0]]]
    # an identity last: no output projection, the heads concatenated are the output (of the input's width)
    identity = bool(layers) and isinstance(layers[-1][1], nn.Identity)
    if any(isinstance(layer, nn.Identity) for _, layer in layers[:-1]):
        # MONAI's SABlock names a fused qkv and, for its other branch, to_q, to_k, to_v set to
        # nn.Identity: those are no projection where the fused one carries all three; an identity
        # in place of one projection alone would be misread as another layout, so only qkv is taken
        kept = [(where, layer) for where, layer in layers[:-1] if not isinstance(layer, nn.Identity)]
        reading = _fit([*kept, layers[-1]], heads) if len(kept) == 1 else None
        return reading if reading is not None and reading.layout == "qkv" else None
    if not 2 <= len(layers) <= 4:
        return None
    shapes = [_shape(layer) for _, layer in (layers[:-1] if identity else layers)]
    d = shapes[0][1]
    out_rows, out_cols = (d, d) if identity else shapes[-1]
    if out_rows != d:  # the output projection gives the input's width back
        return None
    inner = out_cols
    if inner % heads:
        return None
    if len(layers) == 2 and shapes[0][0] == 3 * inner:
        return Reading("qkv", layers, identity)
    if len(layers) == 3 and shapes[0][0] == inner and shapes[1][0] % 2 == 0 \
            and inner % (shapes[1][0] // 2) == 0 and (shapes[1][0] // 2) % (inner // heads) == 0:
        return Reading("q_kv", layers, identity)
    if len(layers) == 3 and shapes[0][0] == 2 * inner and shapes[1][0] == inner \
            and _tokens(layers[0][0]) & {"qk"} and _role(layers[1][0]) == "v":
        # vit-pytorch's to_qk (D, 2I) chunked into q and k, then to_v: only where the names say so (a
        # forward that names to_kv before to_q has the same shapes)
        return Reading("qk_v", layers, identity)
    if len(layers) == 4:
        q, k, v = _ordered_qkv(layers[:3])
        rows = [_shape(q[1])[0], _shape(k[1])[0], _shape(v[1])[0]]
        if rows[0] == inner and rows[1] == rows[2] and inner % rows[1] == 0 and rows[1] % (inner // heads) == 0:
            return Reading("q_k_v", [q, k, v, layers[3]], identity)
    return None


_READ: weakref.WeakKeyDictionary[nn.Module, Reading | None] = weakref.WeakKeyDictionary()


def _reading(module: nn.Module) -> Reading | None:
    if module not in _READ:
        _READ[module] = read_projections(module)
    return _READ[module]


class ByShapeAdapter(StructuralAdapter):
    """The last structural adapter: projections read by :func:`read_projections`."""

    name = "by_shape"
    description = ("projections read from their shapes and the order the forward names them (whisper's "
                   "query/key/value/out, to_q/to_kv/to_out, to_qkv/to_out, a ModuleList of q, k, v)")

    def matches(self, module: nn.Module) -> bool:
        return _reading(module) is not None

    def params(self, module: nn.Module) -> MHAParams:
        reading = self._read(module)
        parts = [weight_bias(layer) for _, layer in reading.projections]
        w_o, b_o = (None, None) if reading.identity_out else parts[-1]
        if reading.layout == "qkv":
            w, b = parts[0]
            w_q, w_k, w_v = w.chunk(3)
            b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
            return MHAParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o)
        if reading.layout == "q_kv":
            (w_q, b_q), (w, b) = parts[0], parts[1]
            w_k, w_v = w.chunk(2)
            b_k, b_v = (None, None) if b is None else b.chunk(2)
            return MHAParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o)
        if reading.layout == "qk_v":
            (w, b), (w_v, b_v) = parts[0], parts[1]
            w_q, w_k = w.chunk(2)
            b_q, b_k = (None, None) if b is None else b.chunk(2)
            return MHAParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o)
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = parts[:3]
        return MHAParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o)

    def sources(self, module: nn.Module) -> list[torch.Tensor]:
        return [p for _, layer in self._read(module).projections for p in layer.parameters()]

    @staticmethod
    def _read(module: nn.Module) -> Reading:
        """The reading of this instance (its class matched at another size may not fit at this one)."""
        reading = _reading(module)
        if reading is None:
            raise NotApplicable(f"{type(module).__name__}'s projections at these sizes fit no layout the by_shape "
                                "adapter reads (a fused (3I, D), q + fused kv, or q, k, v, o)")
        return reading

    def reading_note(self, module: nn.Module) -> str:
        reading = _reading(module)
        if reading is None:
            return ""
        heads = head_count_source(module)
        return reading.describe() + (f"; {heads}" if heads else "")
