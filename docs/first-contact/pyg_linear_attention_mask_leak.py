"""torch_geometric 2.8.1: the linear-attention layers of torch_geometric.nn.attention
(PerformerAttention, PolynormerAttention, SGFormerAttention), called as layer(x, mask) with mask [B, N]
marking the valid nodes, let the padded nodes (mask False) change the valid nodes' outputs.

Each forward zeroes only the masked nodes' values (`v.masked_fill_(~mask, 0.)`); their keys stay in the
normalizer (PerformerAttention's `q @ k.sum(dim=-2)`, Polynormer's `k_sum`, ...), so a valid node's output
depends on the padding's features. Plain torch + torch_geometric, independent of mha-verify (the sweep did
not reach this: the harness's mask forms raised on PerformerAttention, so every mask check was n/a, and the
other two were not built). Expected for a mask of valid nodes: 0 change.
"""
import torch
from torch_geometric.nn.attention import PerformerAttention, PolynormerAttention, SGFormerAttention

B, N, pad = 2, 5, 2
for cls in (PerformerAttention, PolynormerAttention, SGFormerAttention):
    torch.manual_seed(0)
    layer = cls(channels=8, heads=2).eval()
    x = torch.randn(B, N, 8)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[:, N - pad:] = False
    x2 = x.clone()
    x2[:, N - pad:] = 10 * torch.randn(B, pad, 8)  # only the padded nodes change
    with torch.no_grad():
        a = layer(x, mask)[:, : N - pad]
        b = layer(x2, mask)[:, : N - pad]
        c = layer(x[:, : N - pad])  # the same graphs without the padding at all
    print(f"{cls.__name__:20s} valid nodes' output change when only the padding changes: "
          f"{float((a - b).abs().max()):.3g}; masked call vs unpadded call: {float((a - c).abs().max()):.3g}")
