"""segment-anything's image-encoder Attention takes a feature map (B, H, W, C): a sequence (B, L, D) is
given to it as a map of one row of L positions (use_rel_pos=False, its default: plain attention)."""
from mha_verify.properties.adapters import ByShapeAdapter


class OneRow(ByShapeAdapter):
    def call(self, m, q, k, v, mask):
        return m(q[:, None]).squeeze(1)  # (B, 1, L, D) -> (B, L, D)
