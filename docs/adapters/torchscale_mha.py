"""torchscale's MultiheadAttention takes an ``args`` namespace of its own fields, which no size names."""
from types import SimpleNamespace

from torchscale.component.multihead_attention import MultiheadAttention


def self_attention(d_model: int, n_head: int) -> MultiheadAttention:
    args = SimpleNamespace(multiway=False, layernorm_eps=1e-5, xpos_rel_pos=False, xpos_scale_base=512)
    return MultiheadAttention(args, d_model, n_head, self_attention=True)
