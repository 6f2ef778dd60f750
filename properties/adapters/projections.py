"""The three shapes of input projection a structural adapter reads weights from: one fused (D + 2 Dkv, D)
projection (GPT-2's Conv1D, GPT-NeoX's per-head grouping), separate q, k and v projections, and
q, k, v without an output projection; each with the same checks of widths and head counts.
"""

from __future__ import annotations

import torch
from torch import nn

from mha_verify.mha.reference import MHAParams
from mha_verify.properties.adapters import recognition
from mha_verify.properties.adapters.base import Adapter
from mha_verify.properties.adapters.structural import StructuralAdapter, head_dim_of
from mha_verify.properties.adapters.unmodelled import pointwise


def _linear_like(layer: object) -> bool:
    """nn.Linear, HF's Conv1D (a ``weight`` (in, out) and an ``nf`` out-features attribute), a LoRA
    linear (:func:`_lora`) or a pointwise convolution (:func:`pointwise`)."""
    return isinstance(layer, nn.Linear) or (
        isinstance(layer, nn.Module) and type(layer).__name__ == "Conv1D" and hasattr(layer, "nf")
        and isinstance(getattr(layer, "weight", None), torch.Tensor)) or _lora(layer) or pointwise(layer)


def _lora(layer: object) -> bool:
    """A LoRA linear written out (labml's ``lora.Linear``): ``weight`` (out, in) plus ``lora_b`` (out, r) @
    ``lora_a`` (r, in) times a number ``scaling``, its forward W x + b + scaling B A x."""
    w, a, b = (getattr(layer, n, None) for n in ("weight", "lora_a", "lora_b"))
    return isinstance(layer, nn.Module) and all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in (w, a, b)) \
        and isinstance(getattr(layer, "scaling", None), (int, float)) \
        and b.shape[0] == w.shape[0] and a.shape[1] == w.shape[1] and a.shape[0] == b.shape[1]  # type: ignore[union-attr]


def output_layer(layer: object) -> nn.Module | None:
    """The output projection a layer holds under an output name: a linear-like layer, an
    nn.Identity (no projection), or the first of a ModuleList followed only by dropout and
    identities (diffusers' ``to_out = [Linear, Dropout]``), after an einops ``Rearrange`` that merges
    the heads in the standard order (vit-pytorch's ``to_out = [Rearrange('b h n d -> b n (h d)'),
    Linear, Dropout]``); None for anything else."""
    if _linear_like(layer) or isinstance(layer, nn.Identity):
        return layer  # type: ignore[return-value]
    if not isinstance(layer, (nn.ModuleList, nn.Sequential)):
        return None
    parts = list(layer)
    if parts and merges_heads(parts[0]):
        parts = parts[1:]
    if parts and _linear_like(parts[0]) and all(
            isinstance(m, (nn.modules.dropout._DropoutNd, nn.Identity)) for m in parts[1:]):
        return parts[0]
    return None


def merges_heads(layer: object) -> bool:
    """Whether ``layer`` is an einops ``Rearrange`` (no parameters) that merges a head axis ``h`` and a
    head-width axis ``d`` into the last one as ``(h d)``, heads outer: the layout the oracle's
    concatenation of heads has. A pattern that merges ``(d h)`` permutes the output projection's
    inputs and is not read as a plain merge."""
    if type(layer).__name__ != "Rearrange" or not type(layer).__module__.startswith("einops"):
        return False
    pattern = getattr(layer, "pattern", None)
    if not isinstance(pattern, str) or "->" not in pattern:
        return False
    left, right = (" ".join(side.split()) for side in pattern.split("->", 1))
    tokens = left.split()
    return right.endswith("(h d)") and "h" in tokens and "d" in tokens and tokens.index("h") < tokens.index("d")


def weight_bias(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight (out, in), bias (out,) or None) of an nn.Linear, an HF Conv1D (transposed), a LoRA linear
    (its weight plus the scaled low-rank product) or a pointwise convolution (its kernel's axes dropped)."""
    weight = layer.weight
    assert isinstance(weight, torch.Tensor)
    bias = getattr(layer, "bias", None)
    if _lora(layer):  # the weight it applies: W + scaling B A
        lora_a, lora_b = getattr(layer, "lora_a"), getattr(layer, "lora_b")  # noqa: B009 (tensors, to mypy)
        weight = weight + float(getattr(layer, "scaling")) * (lora_b @ lora_a)  # noqa: B009
    elif pointwise(layer):  # (out, in, 1, ...) -> (out, in)
        weight = weight.flatten(1)
    elif not isinstance(layer, nn.Linear):  # Conv1D: y = x @ W + b with W (in, out)
        weight = weight.t()
    return weight, bias if isinstance(bias, torch.Tensor) else None

def _per_head(module: nn.Module, w: torch.Tensor, b: torch.Tensor | None, w_o: torch.Tensor,
              b_o: torch.Tensor | None) -> MHAParams:
    """q, k, v of a (3D, D) projection whose rows are grouped per head, [q_h; k_h; v_h] for each head h
    (GPT-NeoX views its output as (B, L, H, 3 Hd) and chunks the last axis): copies, in our layout."""
    d = w_o.shape[1]
    head_dim = head_dim_of(module, MHAParams(w_o, None, w_o, None, w_o, None, w_o, None))
    n = d // head_dim
    # (3D, D) -> (H, 3, Hd, D) -> three (H * Hd, D); biases (3D,) -> (H, 3, Hd) -> three (D,)
    parts = w.reshape(n, 3, head_dim, w.shape[1]).unbind(1)
    w_q, w_k, w_v = (p.reshape(d, w.shape[1]) for p in parts)
    if b is None:
        return MHAParams(w_q, None, w_k, None, w_v, None, w_o, b_o)
    b_q, b_k, b_v = (p.reshape(d) for p in b.reshape(n, 3, head_dim).unbind(1))
    return MHAParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o)
class FusedQKVAdapter(StructuralAdapter):
    """One fused input projection (D + 2 Dkv, D), split into q, k, v in that order, and an output one."""

    name = "fused_qkv"
    description = "qkv+proj (timm), c_attn+c_proj (nanoGPT, GPT-2 incl. HF Conv1D)"

    def _row(self, module: nn.Module) -> tuple[str, str, bool] | None:
        """(fused name, output name, rows per head) of the row that names ``module``'s projections."""
        for row in recognition.layouts(self.name):
            assert row.fused is not None
            out = next((o for o in row.out if _linear_like(getattr(module, o, None))), None)
            if _linear_like(getattr(module, row.fused, None)) and out is not None:
                return row.fused, out, row.per_head
        return None

    def _names(self, module: nn.Module) -> tuple[str, str] | None:
        row = self._row(module)
        return None if row is None else row[:2]

    def sources(self, module: nn.Module) -> list[torch.Tensor]:
        names = self._names(module)
        assert names is not None
        return [p for name in names for p in getattr(module, name).parameters()]

    def matches(self, module: nn.Module) -> bool:
        names = self._names(module)
        if names is None:
            return False
        w, _ = weight_bias(getattr(module, names[0]))
        return w.shape[0] > w.shape[1] and (w.shape[0] - w.shape[1]) % 2 == 0

    def params(self, module: nn.Module) -> MHAParams:
        names = self._names(module)
        assert names is not None
        # (D + 2 Dkv, D): rows q (D of them: the output projection's input width), then k, then v;
        # Dkv = D without grouping (the chunks of 3), fewer with grouped-query attention (Phi-3)
        w, b = weight_bias(getattr(module, names[0]))
        w_o, b_o = weight_bias(getattr(module, names[1]))
        d = w_o.shape[1]
        row = self._row(module)
        if row is not None and row[2]:
            return _per_head(module, w, b, w_o, b_o)
        kv = (w.shape[0] - d) // 2
        w_q, w_k, w_v = w.split((d, kv, kv))
        b_q, b_k, b_v = (None, None, None) if b is None else b.split((d, kv, kv))
        return MHAParams(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o)


class SeparateQKVAdapter(StructuralAdapter):
    """Separate q, k, v projections and an output one; k and v may have fewer rows (GQA/MQA)."""

    name = "separate_qkv"
    description = ("q_proj/k_proj/v_proj + o_proj|out_proj|output_proj (HF Llama/Mistral/BART/Whisper, fairseq, "
                   "torchtune), to_q/to_k/to_v/to_out (x-transformers), incl. grouped-query")

    def _names(self, module: nn.Module) -> tuple[str, str, str, str] | None:
        for row in recognition.layouts(self.name):
            assert row.q and row.k and row.v
            if all(_linear_like(getattr(module, n, None)) for n in (row.q, row.k, row.v)):
                # an nn.Identity output: no projection (x-transformers with one head of width D)
                out = next((o for o in row.out if output_layer(getattr(module, o, None)) is not None), None)
                if out is not None:
                    return row.q, row.k, row.v, out
        return None

    def matches(self, module: nn.Module) -> bool:
        return self._names(module) is not None

    def params(self, module: nn.Module) -> MHAParams:
        names = self._names(module)
        assert names is not None
        args: list[torch.Tensor | None] = []
        for n in names:
            layer = output_layer(getattr(module, n))
            assert layer is not None
            args += [None, None] if isinstance(layer, nn.Identity) else weight_bias(layer)
        return MHAParams._make(args)


class QKVNoOutputAdapter(StructuralAdapter):
    """``query``, ``key``, ``value`` projections and no output projection (HF BERT self-attention:
    its output projection lives in ``BertSelfOutput``, with the residual and LayerNorm)."""

    name = "qkv_no_output"
    description = "query/key/value without an output projection (HF BertSelfAttention)"

    def _names(self) -> tuple[str, str, str]:
        (row,) = recognition.layouts(self.name)
        assert row.q and row.k and row.v
        return row.q, row.k, row.v

    def matches(self, module: nn.Module) -> bool:
        # any output projection another layout names (or labml's ``output``) means this is not BERT's
        # projection-less layer: by_shape reads it with its output, and names what else it does
        outs = {"output", *(o for row in recognition.PROJECTIONS for o in row.out)}
        return (all(_linear_like(getattr(module, n, None)) for n in self._names())
                and not any(isinstance(getattr(module, n, None), nn.Module) for n in outs))

    def params(self, module: nn.Module) -> MHAParams:
        args: list[torch.Tensor | None] = []
        for n in self._names():
            args += weight_bias(getattr(module, n))
        return MHAParams._make([*args, None, None])


STRUCTURAL: tuple[Adapter, ...] = (FusedQKVAdapter(), SeparateQKVAdapter(), QKVNoOutputAdapter())
