"""Adapters: how a foreign attention module names its weights and wants to be called.

With ``structural``, ``projections``, ``library_facts`` and the tables of ``recognition``, the
only place that knows how other modules name their weights. Every adapter presents one calling
convention to the eager target (``targets.Bound``, the eager implementation of the target
protocol) — ours:

    call(module, q (B, Lq, D), k (B, Lk, D), v (B, Lk, D), mask) -> output (B, Lq, D)

with ``mask`` None, a bool keep-mask (True = may attend) or an additive float mask,
broadcasting to (B, H, Lq, Lk). An adapter converts the mask to the target's own
convention; a call the target cannot express (a mask for a target without one, distinct
q/k/v for a self-attention-only target) raises :class:`NotApplicable`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from mha_verify.mha.reference import MHAParams
from mha_verify.properties.adapters.forward_source import detect_kv_map
from mha_verify.properties.adapters.layer_attrs import has_dropout, set_all_dropout
from mha_verify.properties.adapters.mask_convert import to_kind, to_shape
from mha_verify.properties.adapters.recognition import names_of
from mha_verify.properties.adapters.signature import is_same_input, read_signature
from mha_verify.properties.protocol import Conventions, NotApplicable


def declared_conventions(module: nn.Module, found: Conventions) -> Conventions:
    """``found`` with the grouped-query mapping its forward shows (:func:`detect_kv_map`), then the
    module's ``mha_verify_conventions`` class attribute applied (checked keys): a declaration wins."""
    kv_map, how = detect_kv_map(module)
    if kv_map is not None and (kv_map != found.kv_map or "its forward" in how):  # HF's default goes unsaid
        found = dataclasses.replace(found, kv_map=kv_map, notes=(*found.notes, how))
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
    """The base class of adapters: how the eager target sees one kind of attention layer.

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

    def cached(self, module: nn.Module, x: torch.Tensor, chunks: tuple[int, ...]) -> torch.Tensor:
        """x (B, L, D) through the layer's own KV cache in ``chunks`` (:meth:`Instance.cached`)."""
        raise NotApplicable(f"{self.name} targets are not run through a KV cache")

    def has_dropout(self, module: nn.Module) -> bool:
        return has_dropout(module)

    def set_dropout(self, module: nn.Module, p: float) -> bool:
        """Set every dropout probability of ``module`` to ``p``; False if it has none.

        nn.Dropout modules and float attributes (``dropout``, ``attn_dropout``, ``dropout_p``,
        ``attention_dropout``, ``attn_pdrop``) that layers give to F.dropout or SDPA.
        """
        return set_all_dropout(module, p)


class QKVAdapter(Adapter):
    """``w_q, w_k, w_v, w_o`` with ``forward(q, k, v, mask=None)`` and a bool keep-mask (seed 000, ours).

    A target whose forward takes ``need_weights`` (ours) can also return its weights.
    """

    name = "w_qkvo"
    description = "w_q/w_k/w_v/w_o, forward(q, k, v, mask) with a bool keep-mask (seed 000, mha.MultiHeadAttention)"
    names = names_of("w_qkvo")
    native_mask = frozenset({"bool"})  # seed 000: masked_fill(~mask, -inf)
    returns_weights = False  # forward returns (output, weights) without being asked

    def matches(self, module: nn.Module) -> bool:
        return all(isinstance(getattr(module, n, None), nn.Linear) for n in self.names)

    def _self_attention(self, module: nn.Module) -> bool:
        return read_signature(module).self_attention  # by parameter names, not positional counts

    def _has_mask(self, module: nn.Module) -> bool:
        return read_signature(module).mask is not None

    def conventions(self, module: nn.Module) -> Conventions:
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
        return to_kind(mask, "keep" if "bool" in native else "additive", dtype, takes=native)

    def _args(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None) -> tuple[list[Any], dict[str, Any]]:
        if mask is not None and not self.conventions(module).mask:
            raise NotApplicable("the target's forward takes no mask")
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
    names = names_of("query_key_value")
    native_mask = frozenset({"bool"})
    returns_weights = True


class LinearQKVAdapter(QKVAdapter):
    """``linear_q, linear_k, linear_v, out`` with an additive float mask: seed 002."""

    name = "linear_qkv"
    description = "linear_q/linear_k/linear_v/out with an additive float mask (seed 002)"
    names = names_of("linear_qkv")
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
        sizes = (B, H, Lq, Lk)
        if mask is not None and mask.dim() == 4 and mask.shape[0] == B and mask.shape[1:3] == (1, 1):
            # (B, 1, 1, Lk) -> key_padding_mask (B, Lk)
            padding = to_kind(to_shape(mask, sizes, (True, False, False, True), (0, 3)), "drop", q.dtype)
        elif mask is not None:  # torch's 3-D layout: (B * H, Lq, Lk)
            attn_mask = to_kind(to_shape(mask, sizes, (True,) * 4).reshape(B * H, Lq, Lk), "drop", q.dtype)
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
