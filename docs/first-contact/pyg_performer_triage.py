"""Triage of the FAIL on torch_geometric.nn.attention.performer:PerformerAttention (torch_geometric 2.8.1).

Plain torch + torch_geometric, independent of mha-verify. Shows:
1. the layer's head width is `head_channels` (default 64), not channels/heads: at channels=8, heads=2
   its q/k/v project 8 -> 128 (what the harness's by_shape reading assumed to be 8 -> 8);
2. the layer is ReLU-kernel linear attention (Performer's "generalized attention"), not softmax
   attention: with the same projections, exact softmax attention (SDPA) gives a different output,
   at any head width, so an oracle comparison against softmax cannot hold by design;
(The mask bug is in pyg_linear_attention_mask_leak.py.)
"""
import torch
import torch.nn.functional as F
from torch_geometric.nn.attention import PerformerAttention

torch.manual_seed(0)
layer = PerformerAttention(channels=8, heads=2).eval()
print("1. q projection:", tuple(layer.q.weight.shape), "head_channels =", layer.head_channels,
      "(channels/heads would be 4)")

B, N = 2, 5
x = torch.randn(B, N, 8)
with torch.no_grad():
    out = layer(x)
    q, k, v = (t.reshape(B, N, 2, 64).permute(0, 2, 1, 3) for t in (layer.q(x), layer.k(x), layer.v(x)))
    soft = F.scaled_dot_product_attention(q, k, v).permute(0, 2, 1, 3).reshape(B, N, -1)
    soft = layer.attn_out(soft)
print("2. max |PerformerAttention - softmax attention with its own projections| =",
      float((out - soft).abs().max()), "(max |out| =", float(out.abs().max()), ")")

