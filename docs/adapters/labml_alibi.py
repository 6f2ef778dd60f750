"""labml's AlibiMultiHeadAttention takes (L, B, D) keywords and requires its causal mask (L, L, 1); its
biases m * (j + 1) under that mask are ALiBi's -m * (i - j) plus a constant per row."""
from types import MappingProxyType

import torch

from mha_verify.properties.adapters import ByShapeAdapter


class CausalAlibi(ByShapeAdapter):
    mha_verify_conventions = MappingProxyType({"causal": True, "alibi": True, "self_attention": True, "mask": []})

    def call(self, m, q, k, v, mask):
        x, keep = q.transpose(0, 1), torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).tril()[..., None]
        return m(query=x, key=x, value=x, mask=keep).transpose(0, 1)
