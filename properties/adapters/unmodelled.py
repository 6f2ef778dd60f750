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
* a gate (a module named ``gate``, ``to_gate``, ``to_out_gates``);
* a learned key and value appended to every sequence (torch MHA's ``bias_k``/``bias_v``);
* a normalization the oracle does not apply (vit-pytorch's pre-norm ``norm`` inside the layer);
* anything else: named as it is, with its shape.

A step with no parameter of its own is read from the forward's source: its input added back to its
output (:func:`residual`).
"""

from __future__ import annotations

import inspect
import re

import torch
from torch import nn

from mha_verify.properties.adapters.position_steps import PROJECTION_NAME, convolved_projections, describe

BEYOND = "a step beyond the attention the oracle models, so it cannot be verified yet"
_GATE = re.compile(r"(^|_)gates?($|_)", re.IGNORECASE)
_XL_NAMES = {"u", "v", "r_w_bias", "r_r_bias", "pos_bias_u", "pos_bias_v", "content_bias", "pos_bias"}
_RELATIVE = re.compile(r"rel|relative|pos(ition)?_?(emb|bias|table)|bias_table|pos_?emb", re.IGNORECASE)


def is_gate(name: str) -> bool:
    """Whether a child's name is a gate's (``gate``, ``to_gate``, ``to_out_gates``, ``gate_proj``)."""
    return bool(_GATE.search(name.removeprefix("to_")))


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
    if any(is_gate(part) for part in name.split(".")[:-1]):
        return f"a gate ({name.rpartition('.')[0]}: {type(owner).__name__})"
    if leaf in ("mem_kv", "null_kv"):  # lucidrains' memory keys and values, concatenated before the input's
        return f"a learned key and value appended to every sequence ({name} {shape})"
    if leaf in ("bias_k", "bias_v"):
        prefix = name[: -len(leaf)]
        return f"a learned key and value appended to every sequence ({prefix}bias_k, {prefix}bias_v {shape})"
    if (isinstance(owner, nn.Embedding) and _RELATIVE.search(name)) or _RELATIVE.search(leaf):
        return f"a relative-position table ({name} {shape})"
    if type(owner).__name__.endswith("Norm") and owner is not module:
        return f"a normalization the oracle does not apply ({name.rpartition('.')[0]}: {type(owner).__name__})"
    return f"{name} {shape}"


#: steps that act on each position alone or on every position alike: permuting positions commutes with them
_POSITION_FREE = ("mixing across heads", "a gate", "a learned key and value", "a normalization")


def convolutions_over_positions(module: nn.Module, names: list[str]) -> list[str]:
    """The convolutions among the owners of parameters ``names`` that reach across positions (a kernel
    wider than 1: a short convolution before a linear or delta-rule attention, ConvBERT's span
    convolution, Nystromformer's over its values), each as ``path: Conv1d``; a 1x1 convolution (talking
    heads' mixing) reaches none."""
    found: dict[str, str] = {}
    for name in names:
        path = name.rpartition(".")[0]
        owner = _owner(module, name)
        if isinstance(owner, nn.modules.conv._ConvNd) and any(k > 1 for k in owner.kernel_size):
            found.setdefault(path, f"{path}: {type(owner).__name__}")
    return list(found.values())


def describe_steps(module: nn.Module, names: list[str], heads: int | None) -> tuple[str, bool]:
    """The steps of ``names`` in words, one per step (a norm's weight and bias are one step), and
    whether any may depend on positions (a relative table, Transformer-XL's biases, a parameter not
    named for a step: permuting positions is not assumed to commute with it)."""
    params = dict(module.named_parameters())
    steps = list(dict.fromkeys(describe_step(module, n, params[n], heads) for n in names))
    return ", ".join(steps), not all(step.startswith(_POSITION_FREE) for step in steps)


_EMITS_MASK = re.compile(r"(^|_)(q|k|v|qk|kv|qkv)_and_mask($|_)", re.IGNORECASE)
# what an attention layer's forward (or a helper it names) computes somewhere: scores and their weights
# (any call whose name holds attention/attn/attend: xformers' memory_efficient_attention, flash_attn_func)
_ATTENDS = re.compile(r"softmax|scaled_dot_product|attention\w*\(|attn\w*\(|attend\w*\(|einsum|matmul|bmm|\s@\s",
                      re.IGNORECASE)


def step_without_adapter(module: nn.Module, sources: tuple[tuple[str, str], ...]) -> str | None:
    """Why no adapter reads ``module``, where a child or its source says it (``sources``: the forward's
    and the helpers', :func:`forward_source.forward_sources`): a step the oracle does not model, or no
    attention at all, in words that follow the class's name; None where nothing says why."""
    xl = [name for name, _ in module.named_parameters(recurse=False) if name in _XL_NAMES]
    if len(xl) >= 2:  # speechbrain's RelPosMHAXL: pos_bias_u, pos_bias_v beside a raw in_proj_weight
        return f"takes Transformer-XL's per-head content/position biases ({', '.join(xl)}), {BEYOND}"
    children = dict(module.named_children())
    for name, child in children.items():
        if is_gate(name):
            return f"takes a gate ({name}: {type(child).__name__}), {BEYOND}"
        if _EMITS_MASK.search(name.removeprefix("to_")):
            return f"takes a projection that also gives a learned mask ({name}: {type(child).__name__}), {BEYOND}"
    convolved = convolved_projections(module)
    if convolved:  # Primer-EZ's depthwise convolution over positions, where its projections are not read
        return f"takes {describe(convolved)}, {BEYOND}"
    text = "\n".join(source for _, source in sources)
    if text.strip() and not _ATTENDS.search(text) and not type(module).__module__.startswith("torch.") \
            and not any(_attends(type(m)) for m in module.modules() if m is not module):
        return ("computes no attention weights in its forward (a projection or a helper of an attention layer): "
                "there is no attention to verify")
    return None


def residual(source: str, input_name: str) -> str | None:
    """Where a forward's ``source`` keeps its input aside and adds it back to what it returns (labml's
    retro attention: ``e_res = e`` ... ``return e + e_res``), the line that keeps it; None otherwise. The
    residual of a block is its caller's: a layer that adds it itself computes x + attention(x)."""
    kept = re.finditer(rf"^[ \t]*((?:\w+_)?(?:res|resid|residual|shortcut|skip)(?:_\w+)?)\s*=\s*"
                       rf"{re.escape(input_name)}\s*$", source, re.MULTILINE | re.IGNORECASE)
    for hit in kept:
        name = re.escape(hit.group(1))
        if re.search(rf"\+\s*{name}\b|\b{name}\s*\+", source[hit.end():]):
            return hit.group(0).strip()
    return None


def _attends(cls: type) -> bool:
    """Whether a submodule's class computes attention in its forward (a layer that hands the work to a
    child of its own attends through it); torch's own layers by their names."""
    if cls.__module__.startswith("torch."):
        return "Attention" in cls.__name__
    try:
        return bool(_ATTENDS.search(inspect.getsource(getattr(cls, "forward"))))  # noqa: B009
    except (OSError, TypeError, AttributeError):
        return True  # unread: not claimed to compute none


def pointwise(layer: object) -> bool:
    """A 1x1 convolution (torch's Conv1d/2d/3d, kernel 1, stride 1, no padding, one group): a linear map of
    each position's channels, weight (out, in, 1, ...), applied to a feature map (B, C, H, W) as a Linear to
    (B, L, D). A wider kernel, a stride or groups mix positions or split channels: not a projection."""
    if not isinstance(layer, nn.modules.conv._ConvNd) or layer.transposed or layer.groups != 1:
        return False
    padding = layer.padding
    no_padding = padding == "valid" or (not isinstance(padding, str) and all(p == 0 for p in padding))
    return all(k == 1 for k in layer.kernel_size) and all(s == 1 for s in layer.stride) \
        and (no_padding or padding == "same")


def convolution_projections(module: nn.Module) -> list[str]:
    """The q, k, v projections of ``module`` (children named for them: ``to_q``, ``to_kv``, ``qkv``)
    that are convolutions, or blocks that start with one (LeViT's ``Sequential(Conv2d, BatchNorm)``,
    RvT's ``SpatialConv``), each as ``name: Conv2d``: attention over a feature map's positions. A 1x1
    convolution alone, or followed only by dropout, is a projection (:func:`pointwise`), not one of them."""
    found = []
    for name, child in module.named_children():
        if not PROJECTION_NAME.search(name.removeprefix("to_")):
            continue
        parts = list(child) if isinstance(child, nn.Sequential) else [child]
        if parts and pointwise(parts[0]) and all(
                isinstance(m, (nn.modules.dropout._DropoutNd, nn.Identity)) for m in parts[1:]):
            continue
        convs = [m for m in (parts or [child])[0].modules() if isinstance(m, nn.modules.conv._ConvNd)]
        if convs:
            found.append(f"{name}: {type(convs[0]).__name__}")
    return found
