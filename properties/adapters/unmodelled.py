"""What a layer's parameters beyond its projections are, named for the refusal: a layer the oracle
cannot model is refused at load by the step it takes, never judged against plain attention (where
it would fail every property, and each failure would say nothing of the step).

Read from the parameter's shape, the module that holds it and its name, in this order:

* mixing across heads (talking heads: CaiT's ``mix_heads_pre_attn`` (H, H), x-transformers'
  ``Conv2d(H, H, 1)``): a tensor (H, H), or a 1x1 convolution from H channels to H;
* Transformer-XL's per-head content and position biases (``u``/``v``, ``r_w_bias``/``r_r_bias``,
  ``pos_bias_u``/``pos_bias_v``): a tensor with H rows (or H x Hd entries) under one of those names;
* a relative-position table (Shaw's ``rel_pos_emb`` embedding, SAM's ``rel_pos_h``, a bias table
  indexed by offsets): an embedding or a tensor named for relative positions;
* a normalization the oracle does not apply (vit-pytorch's pre-norm ``norm`` inside the layer);
* anything else: named as it is, with its shape.
"""

from __future__ import annotations

import re

import torch
from torch import nn

_XL_NAMES = {"u", "v", "r_w_bias", "r_r_bias", "pos_bias_u", "pos_bias_v", "content_bias", "pos_bias"}
_RELATIVE = re.compile(r"rel|relative|pos(ition)?_?(emb|bias|table)|bias_table|pos_?emb", re.IGNORECASE)


def _owner(module: nn.Module, name: str) -> nn.Module:
    path = name.rpartition(".")[0]
    return module.get_submodule(path) if path else module


def describe_step(module: nn.Module, name: str, param: torch.Tensor, heads: int | None) -> str:
    """The step parameter ``name`` (a dotted name under ``module``) belongs to, in words."""
    owner, leaf = _owner(module, name), name.rpartition(".")[2]
    shape = tuple(param.shape)
    if heads and heads > 1 and (shape == (heads, heads) or (
            isinstance(owner, nn.Conv2d) and owner.in_channels == owner.out_channels == heads
            and tuple(owner.kernel_size) == (1, 1))):
        return f"mixing across heads (talking heads: {name} {shape})"
    if leaf in _XL_NAMES and heads and shape and (shape[0] == heads or param.numel() % heads == 0) \
            and not isinstance(owner, nn.Linear):
        return f"Transformer-XL's per-head content/position biases ({name} {shape})"
    if (isinstance(owner, nn.Embedding) and _RELATIVE.search(name)) or _RELATIVE.search(leaf):
        return f"a relative-position table ({name} {shape})"
    if type(owner).__name__.endswith("Norm") and owner is not module:
        return f"a normalization the oracle does not apply ({name.rpartition('.')[0]}: {type(owner).__name__})"
    return f"{name} {shape}"


def describe_steps(module: nn.Module, names: list[str], heads: int | None) -> str:
    """The steps of ``names`` in words, one per step (a norm's weight and bias are one step)."""
    params = dict(module.named_parameters())
    steps = [describe_step(module, n, params[n], heads) for n in names]
    return ", ".join(dict.fromkeys(steps))


_PROJECTION_NAME = re.compile(r"(^|_)(q|k|v|qk|kv|qkv|query|key|value)($|_)", re.IGNORECASE)


def convolution_projections(module: nn.Module) -> list[str]:
    """The q, k, v projections of ``module`` (children named for them: ``to_q``, ``to_kv``, ``qkv``)
    that are convolutions, or blocks that start with one (LeViT's ``Sequential(Conv2d, BatchNorm)``,
    RvT's ``SpatialConv``), each as ``name: Conv2d``: attention over a feature map's positions."""
    found = []
    for name, child in module.named_children():
        if not _PROJECTION_NAME.search(name.removeprefix("to_")):
            continue
        first = child[0] if isinstance(child, nn.Sequential) and len(child) else child
        convs = [m for m in first.modules() if isinstance(m, nn.modules.conv._ConvNd)]
        if convs:
            found.append(f"{name}: {type(convs[0]).__name__}")
    return found
