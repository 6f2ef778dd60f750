"""The attention blocks inside a whole exported model, read from its graph, and how they take the mask.

onnxruntime's transformer optimizer fuses a model's attention into contrib nodes
(``com.microsoft.Attention``, ``MultiHeadAttention``, ``GroupQueryAttention``), the ONNX opset 23
``Attention`` op is another; each is named by its node with the attributes that set its interface.
Where a fused node takes the attention mask as *lengths* (``Attention``'s 1-D ``mask_index``, the
count of real tokens ``EmbedLayerNormalization`` or a ``ReduceSum`` makes of the mask;
``GroupQueryAttention``'s ``seqlens_k``), the graph assumes the real tokens come first: onnxruntime
documents that such a mask index requires right-side padding (microsoft/onnxruntime#4376), so the
export holds left padding and holes outside its precondition. ``GroupQueryAttention`` takes
``seqlens_k`` as each item's real tokens minus one (its operator documentation), so an item with no
real token (-1) is outside its precondition too: onnxruntime refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from mha_verify.properties.model.eager import AttentionDims

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention")
_ATTRIBUTES = ("num_heads", "q_num_heads", "kv_num_heads", "scale", "mask_filter_value",
               "unidirectional", "do_rotary", "qkv_hidden_sizes", "is_causal")
#: the input of each fused op that carries the mask, and the producers that make it lengths
_MASK_INPUT = {("com.microsoft", "Attention"): 3, ("com.microsoft", "MultiHeadAttention"): 4,
               ("com.microsoft", "GroupQueryAttention"): 5, ("", "Attention"): 3}


@dataclass(frozen=True)
class Block:
    """One attention node: its name, op (with its domain), interface attributes, and its mask form."""

    name: str
    op: str
    attributes: dict[str, object]
    mask: str  # "lengths" (real tokens first), "mask" (a mask tensor), "none"
    mask_source: str  # the node that made a lengths mask, or ""

    def describe(self) -> str:
        attrs = ", ".join(f"{k} {v}" for k, v in self.attributes.items())
        mask = {"lengths": f"the mask as lengths from {self.mask_source} (right padding only)",
                "mask": "a mask tensor", "none": "no mask"}[self.mask]
        return f"{self.name} ({self.op}; {attrs}; {mask})"


def attention_blocks(model: onnx.ModelProto) -> list[Block]:
    """Every attention node of ``model``'s main graph, in graph order."""
    producers = {out: node for node in model.graph.node for out in node.output}
    blocks: list[Block] = []
    for node in model.graph.node:
        domain = node.domain if node.domain != "ai.onnx" else ""
        if node.op_type not in ATTENTION_OPS or (domain, node.op_type) not in _MASK_INPUT:
            continue
        attributes = {a.name: _value(helper.get_attribute_value(a)) for a in node.attribute if a.name in _ATTRIBUTES}
        index = _MASK_INPUT[(domain, node.op_type)]
        mask_name = node.input[index] if len(node.input) > index else ""
        mask, source = "none", ""
        if mask_name:
            producer = producers.get(mask_name)
            lengths = node.op_type == "GroupQueryAttention" or (producer is not None and (
                producer.op_type == "ReduceSum"
                or (producer.op_type == "EmbedLayerNormalization" and list(producer.output).index(mask_name) == 1)))
            mask = "lengths" if lengths else "mask"
            source = (producer.name or producer.op_type) if lengths and producer is not None else ""
        op = f"{domain}.{node.op_type}" if domain else f"onnx.{node.op_type}"
        blocks.append(Block(node.name or f"{node.op_type}#{len(blocks)}", op, attributes, mask, source))
    return blocks


def _value(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return list(value) if isinstance(value, (list, tuple)) else value


def padding_precondition(blocks: list[Block]) -> str:
    """Why the graph holds only right padding ("" where no block reads the mask as lengths)."""
    lengths = [b for b in blocks if b.mask == "lengths"]
    if not lengths:
        return ""
    names = ", ".join(b.name for b in lengths[:3]) + (f" and {len(lengths) - 3} more" if len(lengths) > 3 else "")
    verb = "takes" if len(lengths) == 1 else "take"
    return (f"{names} {verb} the attention mask as lengths ({lengths[0].mask_source or 'the node'} counts the "
            "real tokens), which onnxruntime documents as right-side padding only (microsoft/onnxruntime#4376): left "
            "padding and holes are outside the graph's precondition")


def tokens_precondition(blocks: list[Block]) -> str:
    """Why every item needs at least one real token ("" where no block says so)."""
    gqa = [b for b in blocks if b.op.endswith("GroupQueryAttention")]
    if not gqa:
        return ""
    who = f"{gqa[0].name} and {len(gqa) - 1} more take" if len(gqa) > 1 else f"{gqa[0].name} takes"
    return (f"{who} seqlens_k, each item's real tokens minus one (GroupQueryAttention's operator "
            "documentation): an item with no real token so far is outside the graph's precondition")


def disagreements(block: Block, dims: AttentionDims) -> list[str]:
    """Where ``block``'s attributes state another attention than the eager model's config: its head
    counts, and a scale other than 1/sqrt(head_dim) where the config names no other scaling."""
    said: list[str] = []
    heads = block.attributes.get("num_heads", block.attributes.get("q_num_heads"))
    if isinstance(heads, int) and dims.heads and heads != dims.heads:
        said.append(f"num_heads {heads} where the eager model's config has num_attention_heads {dims.heads}")
    kv = block.attributes.get("kv_num_heads")
    if isinstance(kv, int) and dims.kv_heads and kv != dims.kv_heads:
        said.append(f"kv_num_heads {kv} where the eager model's config has {dims.kv_heads} key/value heads")
    scale = block.attributes.get("scale")
    if isinstance(scale, float) and scale != 0.0 and dims.scale and abs(scale - dims.scale) > 1e-4 * dims.scale:
        said.append(f"scale {scale:.6g} where the eager model's is 1/sqrt(head_dim {dims.head_dim}) = {dims.scale:.6g}")
    return said
