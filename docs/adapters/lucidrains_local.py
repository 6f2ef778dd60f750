"""lucidrains' LocalAttention (local-attention 1.11.2) has no projections: it attends over q, k, v already
split into heads, in buckets of window_size that see their neighbours. Given the projections any layer
would have and one bucket as long as any sequence drawn (max_length), it is softmax attention over every key.
It is not: autopad's zero padding is attended unless a mask is passed (docs/ecosystem.md)."""
from types import MappingProxyType

from local_attention import LocalAttention
from torch import nn


class Projected(nn.Module):
    mha_verify_conventions = MappingProxyType({"max_length": 128})

    def __init__(self, d_model, n_head):
        super().__init__()
        self.heads, self.to_qkv, self.to_out = n_head, nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.attend = LocalAttention(window_size=128, autopad=True, use_rotary_pos_emb=False)

    def forward(self, x):
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        return self.to_out(self.attend(q, k, v).transpose(1, 2).flatten(2))
