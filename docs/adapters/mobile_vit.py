"""vit-pytorch's MobileViT Attention takes patches (B, P, N, D), attending over N within each of P patch
positions: a sequence (B, L, D) is given as one patch position (P = 1)."""
from mha_verify.properties.adapters import ByShapeAdapter


class OnePatch(ByShapeAdapter):
    def call(self, m, q, k, v, mask):
        return m(q[:, None])[:, 0]  # (B, 1, L, D) -> (B, L, D)
