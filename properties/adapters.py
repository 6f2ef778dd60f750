"""Adapters: how a foreign attention module names its weights and wants to be called.

This is the only place that knows the naming conventions of other modules. Every adapter
presents one calling convention to the rest of the harness — ours:

    call(module, q (B, Lq, D), k (B, Lk, D), v (B, Lk, D), mask) -> output (B, Lq, D)

with ``mask`` None, a bool keep-mask (True = may attend) or an additive float mask,
broadcasting to (B, H, Lq, Lk). An adapter converts the mask to the target's own
convention; a call the target cannot express (a mask for a target without one, distinct
q/k/v for a self-attention-only target) raises :class:`NotApplicable`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mha_verify.mha.masks import additive_mask, keep_mask
from mha_verify.mha.reference import MHAParams


class NotApplicable(Exception):  # noqa: N818 -- a verdict, not an error
    """The target cannot express this call (no mask argument, self-attention only, ...)."""


MASK_FORM_NAMES = ("BHLL", "B1LL", "11LL", "LL", "B11L")
FULLY_MASKED = ("zeros", "uniform", "nan")


@dataclass(frozen=True)
class Conventions:
    """What a target supports and how it behaves, as its adapter found it or its author declared it.

    The runner decides from these, before a property runs, whether the property applies.

    mask: the mask types the target takes natively, a subset of {"bool", "float"}; empty
        when its forward takes no mask.
    mask_forms: the mask shapes it accepts, a subset of "BHLL" (B, H, Lq, Lk), "B1LL",
        "11LL", "LL" (Lq, Lk) and "B11L" (key padding, (B, 1, 1, Lk)).
    cross_attention: False for self-attention-only targets (forward(x)).
    weights: True if the target can return attention weights (B, H, Lq, Lk).
    fully_masked: what a fully masked query row gives: "zeros" (our contract: w_o(0) = b_o),
        "uniform" (weights 1/Lk over all keys, as layers that mask with finfo.min compute)
        or "nan" (e.g. torch.nn.MultiheadAttention); declared, never inferred from outputs.
    causal: the target applies a causal mask itself (query i sees keys j <= i).
    grads: gradients can be taken through it (False for an onnxruntime session).
    dropout: it has a dropout probability the harness can set (False: none, or not settable).
    sizes: a fixed (d_model, n_head) (an exported model), or None: any size can be built.
    dtype: a fixed compute dtype (an exported model), or None: built in the dtype asked for.
    kv_heads: key/value heads for grouped-query attention, None for H (read from weights).
    torch_modes: torch's inference mode and training mode reach the computation (False for an
        onnxruntime session: it computes the same whatever torch's modes).
    notes: the conventions in words, printed in the report.
    """

    mask: frozenset[str] = frozenset({"bool", "float"})
    mask_forms: frozenset[str] = frozenset(MASK_FORM_NAMES)
    cross_attention: bool = True
    weights: bool = False
    fully_masked: str = "zeros"
    causal: bool = False
    grads: bool = True
    dropout: bool = True
    sizes: tuple[int, int] | None = None
    dtype: torch.dtype | None = None
    kv_heads: int | None = None
    torch_modes: bool = True
    notes: tuple[str, ...] = field(default=())

    def declare(self, declaration: Mapping[str, object], *, source: str = "declaration") -> Conventions:
        """These conventions with ``declaration`` applied; ValueError naming an unknown key or a bad value.

        Keys: mask (types: "bool", "float"), mask_forms, cross_attention, self_attention (its
        negation), weights, fully_masked, causal, grads, dropout, kv_heads.
        """
        changes: dict[str, object] = {}
        for key, value in declaration.items():
            if key not in _DECLARABLE:
                raise ValueError(f"{source}: unknown convention {key!r}; known: {', '.join(sorted(_DECLARABLE))}")
            name, parse = _DECLARABLE[key]
            try:
                changes[name] = parse(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{source}: {key}={value!r}: {exc}") from None
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> str:
        """One line: the conventions a verdict was reached under."""
        mask = "/".join(sorted(self.mask)) or "none"
        parts = [f"mask {mask}" + ("" if not self.mask or self.mask_forms == frozenset(MASK_FORM_NAMES)
                                   else f" ({', '.join(sorted(self.mask_forms))})"),
                 "cross-attention" if self.cross_attention else "self-attention",
                 f"fully masked rows -> {self.fully_masked}"]
        if self.causal:
            parts.append("causal")
        if self.kv_heads:
            parts.append(f"{self.kv_heads} kv heads")
        if self.sizes:
            parts.append(f"fixed d_model={self.sizes[0]}, n_head={self.sizes[1]}")
        if self.dtype is not None:
            parts.append(str(self.dtype).replace("torch.", ""))
        return "; ".join(parts + list(self.notes))


def _subset(allowed: tuple[str, ...]) -> Callable[[object], frozenset[str]]:
    def parse(value: object) -> frozenset[str]:
        if not isinstance(value, (str, tuple, list, set, frozenset)):
            raise TypeError("expected a name or a collection of names")
        items = (value,) if isinstance(value, str) else tuple(value)
        bad = [v for v in items if v not in allowed]
        if bad:
            raise ValueError(f"expected a subset of {allowed}")
        return frozenset(items)
    return parse


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected True or False")
    return value


def _choice(allowed: tuple[str, ...]) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {allowed}")
        return str(value)
    return parse


def _positive_or_none(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("expected a positive int or None")
    return value


_DECLARABLE: dict[str, tuple[str, Callable[[object], object]]] = {
    "mask": ("mask", _subset(("bool", "float"))),
    "mask_forms": ("mask_forms", _subset(MASK_FORM_NAMES)),
    "cross_attention": ("cross_attention", _flag),
    "self_attention": ("cross_attention", lambda v: not _flag(v)),
    "weights": ("weights", _flag),
    "fully_masked": ("fully_masked", _choice(FULLY_MASKED)),
    "causal": ("causal", _flag),
    "grads": ("grads", _flag),
    "dropout": ("dropout", _flag),
    "kv_heads": ("kv_heads", _positive_or_none),
}


def declared_conventions(module: nn.Module, found: Conventions) -> Conventions:
    """``found`` with the module's ``mha_verify_conventions`` class attribute applied (checked keys)."""
    declaration = getattr(module, "mha_verify_conventions", None)
    if not declaration:
        return found
    return found.declare(dict(declaration), source=f"{type(module).__name__}.mha_verify_conventions")


def _linear_params(*layers: nn.Linear) -> MHAParams:
    args: list[torch.Tensor | None] = []
    for lin in layers:
        args += [lin.weight, lin.bias]
    return MHAParams._make(args)


class Adapter:
    """The adapter protocol: how the harness sees one kind of attention layer.

    Subclass it to verify a layer no built-in adapter recognizes, and choose it with
    ``--adapter pkg.mod:Name`` (or ``path/to/file.py:Name``). Two methods are enough::

        class MyAdapter(Adapter):
            mha_verify_conventions = {"mask": "bool", "causal": False}   # checked keys

            def params(self, m):                       # weights in nn.Linear's (out, in) layout
                return MHAParams(m.wq.weight, m.wq.bias, m.wk.weight, m.wk.bias,
                                 m.wv.weight, m.wv.bias, m.wo.weight, m.wo.bias)

            def call(self, m, q, k, v, mask):          # mask: None, bool keep-mask or additive
                return m(q, k, v, mask)                # -> (B, Lq, D)

    ``mha_verify_conventions`` (on the adapter, or on the layer's class) is applied through
    :meth:`Conventions.declare`: an unknown key or a bad value is an error that names it.
    ``matches`` decides automatic selection (a forced adapter is used as it is); override
    ``call_with_weights`` if the layer can return its attention weights (B, H, Lq, Lk).
    """

    name = "base"
    description = ""
    mha_verify_conventions: Mapping[str, object] = {}

    def matches(self, module: nn.Module) -> bool:
        return False

    def conventions(self, module: nn.Module) -> Conventions:
        found = Conventions(dropout=self.has_dropout(module))
        if self.mha_verify_conventions:
            found = found.declare(self.mha_verify_conventions,
                                  source=f"{type(self).__name__}.mha_verify_conventions")
        return declared_conventions(module, found)

    def params(self, module: nn.Module) -> MHAParams:
        raise NotImplementedError

    def call(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def call_with_weights(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotApplicable(f"{self.name} targets do not return attention weights")

    def has_dropout(self, module: nn.Module) -> bool:
        from mha_verify.properties.adapters_call import has_dropout

        return has_dropout(module)

    def set_dropout(self, module: nn.Module, p: float) -> bool:
        """Set every dropout probability of ``module`` to ``p``; False if it has none.

        nn.Dropout modules and float attributes (``dropout``, ``attn_dropout``, ``dropout_p``,
        ``attention_dropout``, ``attn_pdrop``) that layers give to F.dropout or SDPA.
        """
        from mha_verify.properties.adapters_call import set_all_dropout

        return set_all_dropout(module, p)


class QKVAdapter(Adapter):
    """``w_q, w_k, w_v, w_o`` with ``forward(q, k, v, mask=None)`` and a bool keep-mask (seed 000, ours).

    A target whose forward takes ``need_weights`` (ours) can also return its weights.
    """

    name = "w_qkvo"
    description = "w_q/w_k/w_v/w_o, forward(q, k, v, mask) with a bool keep-mask (seed 000, mha.MultiHeadAttention)"
    names = ("w_q", "w_k", "w_v", "w_o")
    native_mask = frozenset({"bool"})  # seed 000: masked_fill(~mask, -inf)
    returns_weights = False  # forward returns (output, weights) without being asked

    def matches(self, module: nn.Module) -> bool:
        return all(isinstance(getattr(module, n, None), nn.Linear) for n in self.names)

    def _self_attention(self, module: nn.Module) -> bool:
        from mha_verify.properties.adapters_call import read_signature  # by parameter names, not positional counts

        return read_signature(module).self_attention

    def _has_mask(self, module: nn.Module) -> bool:
        from mha_verify.properties.adapters_call import read_signature

        return read_signature(module).mask is not None

    def conventions(self, module: nn.Module) -> Conventions:
        from mha_verify.properties.adapters_call import read_signature

        found = Conventions(
            mask=self.native_mask if self._has_mask(module) else frozenset(),
            cross_attention=not self._self_attention(module),
            weights=read_signature(module).need_weights or self.returns_weights,
            dropout=self.has_dropout(module),
            notes=(f"adapter {self.name}",),
        )
        return declared_conventions(module, found)

    def params(self, module: nn.Module) -> MHAParams:
        return _linear_params(*(getattr(module, n) for n in self.names))

    def _mask_for(self, module: nn.Module, mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        if mask is None:
            return None
        native = self.conventions(module).mask
        if mask.dtype == torch.bool and "bool" not in native:
            return additive_mask(mask, dtype)
        if mask.dtype != torch.bool and "float" not in native:
            if bool(((mask != 0) & (mask != -math.inf)).any()):
                raise NotApplicable("the target takes bool masks only: finite float biases have no bool form")
            return keep_mask(mask)
        return mask

    def _args(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None) -> tuple[list[Any], dict[str, Any]]:
        if mask is not None and not self.conventions(module).mask:
            raise NotApplicable("the target's forward takes no mask")
        from mha_verify.properties.adapters_call import is_same_input, read_signature

        m = self._mask_for(module, mask, q.dtype)
        sig = read_signature(module)
        args: list[Any] = [q]
        if sig.self_attention:
            if not is_same_input(q, k, v):
                raise NotApplicable(f"the target is self-attention only: forward({sig.input})")
        else:
            args += [k, v]
        return args, ({} if m is None or sig.mask is None else {sig.mask: m})

    def call(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: torch.Tensor | None) -> torch.Tensor:
        args, kwargs = self._args(module, q, k, v, mask)
        out = module(*args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def call_with_weights(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.conventions(module).weights:
            raise NotApplicable(f"{type(module).__name__}.forward has no need_weights argument")
        args, kwargs = self._args(module, q, k, v, mask)
        out = module(*args, **kwargs) if self.returns_weights else module(*args, **kwargs, need_weights=True)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise NotApplicable("the target's forward does not return (output, weights)")
        return out[0], out[1]


class QueryKeyValueAdapter(QKVAdapter):
    """``query, key, value, fc_out`` with ``forward(x) -> (output, weights)``: seed 001.

    Self-attention only and no mask argument.
    """

    name = "query_key_value"
    description = "query/key/value/fc_out, forward(x) -> (output, weights), no mask (seed 001)"
    names = ("query", "key", "value", "fc_out")
    native_mask = frozenset({"bool"})
    returns_weights = True


class LinearQKVAdapter(QKVAdapter):
    """``linear_q, linear_k, linear_v, out`` with an additive float mask: seed 002."""

    name = "linear_qkv"
    description = "linear_q/linear_k/linear_v/out with an additive float mask (seed 002)"
    names = ("linear_q", "linear_k", "linear_v", "out")
    native_mask = frozenset({"float"})


class TorchMHAAdapter(Adapter):
    """``torch.nn.MultiheadAttention``: packed in_proj weights, batch_first or not, and a
    bool ``attn_mask`` where True means *not* allowed (the opposite of ours), shaped
    (Lq, Lk) or (B * H, Lq, Lk). Fully masked rows give NaN, as documented by torch.
    """

    name = "torch_mha"
    description = "torch.nn.MultiheadAttention (in_proj_weight, out_proj; attn_mask True = not allowed)"

    def matches(self, module: nn.Module) -> bool:
        return isinstance(module, nn.MultiheadAttention)

    def conventions(self, module: nn.Module) -> Conventions:
        found = Conventions(
            weights=True, fully_masked="nan",
            notes=("adapter torch_mha", "attn_mask is inverted (True = not allowed) and flattened to (B*H, Lq, Lk); "
                   "a key-padding mask (B, 1, 1, Lk) goes through key_padding_mask (B, Lk), inverted",),
        )
        return declared_conventions(module, found)  # e.g. self_attention: called as m(x, x, x)

    def params(self, module: nn.Module) -> MHAParams:
        assert isinstance(module, nn.MultiheadAttention)
        if module.in_proj_weight is not None:
            w_q, w_k, w_v = module.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
        b: tuple[torch.Tensor | None, ...] = (None, None, None)
        if module.in_proj_bias is not None:
            b = tuple(module.in_proj_bias.chunk(3))
        return MHAParams(w_q, b[0], w_k, b[1], w_v, b[2], module.out_proj.weight, module.out_proj.bias)

    def _run(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: torch.Tensor | None, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert isinstance(module, nn.MultiheadAttention)
        B, Lq, Lk, H = q.shape[0], q.shape[1], k.shape[1], module.num_heads
        attn_mask = padding = None
        if mask is not None and mask.dim() == 4 and mask.shape[0] == B and mask.shape[1:3] == (1, 1):
            padding = mask[:, 0, 0, :].expand(B, Lk)  # (B, 1, 1, Lk) -> key_padding_mask (B, Lk)
            padding = ~padding if padding.dtype == torch.bool else padding
        elif mask is not None:
            full = mask.expand(B, H, Lq, Lk).reshape(B * H, Lq, Lk)  # torch's 3-D layout: (B * H, Lq, Lk)
            attn_mask = ~full if full.dtype == torch.bool else full
        if not module.batch_first:  # (B, L, D) -> (L, B, D)
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        out, weights = module(q, k, v, attn_mask=attn_mask, key_padding_mask=padding, need_weights=need_weights,
                              average_attn_weights=False)
        if not module.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def call(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: torch.Tensor | None) -> torch.Tensor:
        return self._run(module, q, k, v, mask, need_weights=False)[0]

    def call_with_weights(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        out, weights = self._run(module, q, k, v, mask, need_weights=True)
        assert weights is not None
        return out, weights

    def set_dropout(self, module: nn.Module, p: float) -> bool:
        assert isinstance(module, nn.MultiheadAttention)
        module.dropout = p
        return True


ADAPTERS: dict[str, Adapter] = {a.name: a for a in (
    TorchMHAAdapter(), QKVAdapter(), QueryKeyValueAdapter(), LinearQKVAdapter(),
)}


def _all_adapters() -> dict[str, Adapter]:
    """The built-in adapters, in matching order: the exact ones first, then those that recognize
    library layers by structure (``mha_verify.properties.adapters_structure``)."""
    from mha_verify.properties.adapters_structure import STRUCTURAL

    for adapter in STRUCTURAL:
        ADAPTERS.setdefault(adapter.name, adapter)
    return ADAPTERS


_LOADED: dict[str, Adapter] = {}


def load_adapter(spec: str) -> Adapter:
    """A user's adapter from ``pkg.mod:Name`` or ``path/to/file.py:Name``: an Adapter subclass
    (instantiated without arguments) or instance, loaded once. ValueError naming what is wrong."""
    if spec not in _LOADED:
        _LOADED[spec] = _load_adapter(spec)
    return _LOADED[spec]


def _load_adapter(spec: str) -> Adapter:
    from mha_verify.properties.targets import TargetError, _load_attr

    try:
        obj = _load_attr(spec)
    except TargetError as exc:
        raise ValueError(f"--adapter {spec}: {exc}") from None
    if inspect.isclass(obj) and issubclass(obj, Adapter):
        obj = obj()
    if not isinstance(obj, Adapter):
        raise ValueError(f"--adapter {spec} is a {type(obj).__name__}, not a properties.adapters.Adapter subclass")
    if obj.name == "base":
        obj.name = spec.rpartition(":")[2]
    if obj.mha_verify_conventions:  # checked now: an unknown key is a usage error, not 17 failures
        Conventions().declare(obj.mha_verify_conventions, source=f"{type(obj).__name__}.mha_verify_conventions")
    return obj


def find_adapter(module: nn.Module, name: str | None = None) -> Adapter:
    """The adapter named ``name`` (a built-in name, or ``pkg.mod:Name`` for a user's), or the
    first whose structure ``module`` matches.

    Raises ValueError naming the known adapters when none applies.
    """
    adapters = _all_adapters()
    known = ", ".join(f"{a.name} ({a.description})" for a in adapters.values())
    if name is not None and name != "auto":
        if ":" in name:
            return load_adapter(name)
        if name not in adapters:
            raise ValueError(f"unknown adapter {name!r}; known: {', '.join(adapters)} or pkg.mod:YourAdapter")
        return adapters[name]
    for adapter in adapters.values():
        if adapter.matches(module):
            return adapter
    raise ValueError(
        f"no adapter recognizes {type(module).__name__} (its children: "
        f"{', '.join(n for n, _ in module.named_children()) or 'none'}); known adapters: {known}"
    )
