"""vit-pytorch's levjepa_nd Attention takes its rotary, positions and masks as required arguments, None
where a model gives none: plain attention then."""
from mha_verify.properties.adapters import ByShapeAdapter


class NoPositions(ByShapeAdapter):
    def call(self, m, q, k, v, mask):
        return m(q, None, None, None, None)  # rotary_emb, pos, block_mask, dense_mask
