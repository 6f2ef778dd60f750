"""fair-esm's axial attention over a multiple sequence alignment x (rows R, columns C, batch B, D): a sequence
(B, L, D) is one row of L columns to RowSelfAttention, one column of L rows to ColumnSelfAttention."""
from mha_verify.properties.adapters import ByShapeAdapter


class OneRow(ByShapeAdapter):
    def call(self, m, q, k, v, mask):
        return m(q.transpose(0, 1)[None])[0][0].transpose(0, 1)  # (1, L, B, D) -> (B, L, D)


class OneColumn(ByShapeAdapter):
    def call(self, m, q, k, v, mask):
        return m(q.transpose(0, 1)[:, None])[0][:, 0].transpose(0, 1)  # (L, 1, B, D) -> (B, L, D)
