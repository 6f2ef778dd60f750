"""Triage of the FAIL on espnet2.asr.state_spaces.attention:MultiHeadedAttention (espnet 202511).

Plain torch + espnet2, independent of mha-verify. The layer's mask convention is ESPnet's: a mask of
(B, 1, T2) or (B, T1, T2) with 1/True = a key that may be attended; `forward_attention` turns it into
`mask.unsqueeze(1).eq(0)` (True = removed) before `masked_fill`. Read with that convention the layer
agrees with SDPA in float64; read as the harness read it ("bool True = masked out", a float mask of
zeros for all-keep) it does not, which is the whole of the sweep's 8 failures.
"""
import torch
import torch.nn.functional as F
from espnet2.asr.state_spaces.attention import MultiHeadedAttention

torch.manual_seed(0)
B, L, D, H = 2, 5, 8, 2
layer = MultiHeadedAttention(D, H).double().eval()
x = torch.randn(B, L, D, dtype=torch.float64)
keep = torch.rand(B, L, L) > 0.4
keep[..., 0] = True  # no fully masked row


def reference(x, keep):
    q, k, v = (lin(x).view(B, L, H, D // H).transpose(1, 2) for lin in (layer.linear_q, layer.linear_k, layer.linear_v))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=None if keep is None else keep[:, None])
    return layer.linear_out(o.transpose(1, 2).reshape(B, L, D))


with torch.no_grad():
    print("no mask:                     max |layer - SDPA| =", float((layer(x)[0] - reference(x, None)).abs().max()))
    print("ESPnet convention (True=keep): max |layer - SDPA| =", float((layer(x, mask=keep)[0] - reference(x, keep)).abs().max()))
    print("harness's reading (True=drop): max |layer - SDPA| =", float((layer(x, mask=~keep)[0] - reference(x, keep)).abs().max()))
    zeros = torch.zeros(B, L, L, dtype=torch.float64)  # an additive 'all keep' mask, as the harness passed
    out = layer(x, mask=zeros)[0]
    print("additive all-keep float mask: output == linear_out.bias everywhere:",
          bool(torch.allclose(out, layer.linear_out.bias.expand_as(out))))
