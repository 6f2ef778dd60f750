"""A layer that wraps one ``torch.nn.MultiheadAttention`` and hands it the caller's masks (speechbrain's
``nnet.attention.MultiheadAttention``: its inputs permuted to (L, B, E), ``attn_mask`` and
``key_padding_mask`` passed through to ``self.att``): verified with the inner layer's weights, called
through the wrapper.

Read only where everything agrees: the wrapper's parameters are all the inner layer's (no norm, no
projection of its own), its forward takes queries, keys and values by name, adds no input back (a
residual), and its source passes each mask argument it has to the inner call by keyword. The masks then follow torch's
convention (bool True = not allowed, float added, key padding (B, Lk) True = ignored) because torch's own
layer applies them. How the wrapper lays out its inputs is read by the probe (:mod:`layout_probe`).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from mha_verify.mha.reference import MHAParams
from mha_verify.properties.adapters.base import Adapter, TorchMHAAdapter, declared_conventions
from mha_verify.properties.adapters.forward_source import forward_sources
from mha_verify.properties.adapters.layout_probe import from_layer, read_layout, to_layer
from mha_verify.properties.adapters.mask_convert import to_kind, to_shape
from mha_verify.properties.adapters.signature import first_output, read_signature
from mha_verify.properties.protocol import Conventions

_TORCH = TorchMHAAdapter()


def inner_mha(module: nn.Module) -> tuple[str, nn.MultiheadAttention] | None:
    """(name, layer) of the one ``nn.MultiheadAttention`` under ``module`` that holds all its parameters."""
    if isinstance(module, nn.MultiheadAttention):
        return None
    found = [(n, m) for n, m in module.named_modules() if isinstance(m, nn.MultiheadAttention)]
    if len(found) != 1:
        return None
    name, inner = found[0]
    if {id(p) for p in module.parameters()} != {id(p) for p in inner.parameters()}:
        return None
    return name, inner


def _passed(source: str, inner: str, names: list[str]) -> bool:
    """Whether ``source`` calls ``self.<inner>(...)`` handing each of ``names`` on by keyword
    (``attn_mask=attn_mask``)."""
    call = re.search(rf"self\.{re.escape(inner)}\s*\(", source)
    if call is None:
        return False
    rest = source[call.end():]
    return all(re.search(rf"\b{re.escape(n)}\s*=\s*{re.escape(n)}\b", rest) for n in names)


class WrappedTorchMHAAdapter(Adapter):
    """A wrapper around one ``torch.nn.MultiheadAttention`` that passes its masks through (module docstring)."""

    name = "wrapped_torch_mha"
    description = ("a layer wrapping one torch.nn.MultiheadAttention (all its weights), handing it attn_mask and "
                   "key_padding_mask by keyword (speechbrain's MultiheadAttention)")

    def matches(self, module: nn.Module) -> bool:
        found = inner_mha(module)
        if found is None or "." in found[0]:
            return False
        sig = read_signature(module)
        if sig.key is None or sig.value is None:
            return False
        masks = [n for n in (sig.mask, sig.padding) if n is not None]
        source = "\n".join(text for _, text in forward_sources(module))
        added = re.search(rf"\+\s*{re.escape(sig.input)}\b|\b{re.escape(sig.input)}\s*\+(?!\+)", source)
        return added is None and _passed(source, found[0], masks)  # its input added back: a residual, not MHA

    def _inner(self, module: nn.Module) -> nn.MultiheadAttention:
        found = inner_mha(module)
        assert found is not None
        return found[1]

    def conventions(self, module: nn.Module) -> Conventions:
        sig = read_signature(module)
        layout, how = self._layout(module)
        found = Conventions(
            fully_masked="nan", layout=layout,
            mask=frozenset({"bool", "float"}) if sig.mask is not None or sig.padding is not None else frozenset(),
            mask_forms=Conventions().mask_forms if sig.mask is not None else frozenset({"B11L"}),
            notes=(f"adapter {self.name}: the weights of its {type(self._inner(module)).__name__} "
                   f"({inner_mha(module)[0]}), which its forward hands "  # type: ignore[index]
                   f"{', '.join(n for n in (sig.mask, sig.padding) if n)} by keyword: torch's mask convention "
                   "(bool True = not allowed, float added, key padding True = ignored)", *((how,) if how else ())),
        )
        return declared_conventions(module, found)

    def _layout(self, module: nn.Module) -> tuple[str, str]:
        sig = read_signature(module)
        inner = self._inner(module)

        def run(x: torch.Tensor) -> torch.Tensor:
            assert sig.key is not None and sig.value is not None
            return first_output(module.forward(**{sig.input: x, sig.key: x, sig.value: x}))

        layout, how = read_layout(module, run, inner.embed_dim, inner.out_proj.weight.dtype)
        return layout, how

    def params(self, module: nn.Module) -> MHAParams:
        return _TORCH.params(self._inner(module))

    def call(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: torch.Tensor | None) -> torch.Tensor:
        sig = read_signature(module)
        assert sig.key is not None and sig.value is not None
        inner = self._inner(module)
        B, Lq, Lk, H = q.shape[0], q.shape[1], k.shape[1], inner.num_heads
        kwargs: dict[str, object] = {}
        sizes = (B, H, Lq, Lk)
        if mask is not None and sig.padding is not None and mask.dim() == 4 and mask.shape[0] == B \
                and mask.shape[1:3] == (1, 1):
            kwargs[sig.padding] = to_kind(to_shape(mask, sizes, (True, False, False, True), (0, 3)), "drop", q.dtype)
        elif mask is not None and sig.mask is not None:
            kwargs[sig.mask] = to_kind(to_shape(mask, sizes, (True,) * 4).reshape(B * H, Lq, Lk), "drop", q.dtype)
        elif mask is not None:
            raise ValueError(f"{type(module).__name__} takes key padding only; this mask is not one")
        layout = self._layout(module)[0]  # the probe is cached per module; the rest of the conventions is not needed
        out = module(**{sig.input: to_layer(q, layout), sig.key: to_layer(k, layout), sig.value: to_layer(v, layout)},
                     **kwargs)
        return from_layer(first_output(out), layout)

    def set_dropout(self, module: nn.Module, p: float) -> bool:
        return _TORCH.set_dropout(self._inner(module), p)
