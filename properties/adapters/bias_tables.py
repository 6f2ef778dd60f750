"""A relative-position bias gathered from a layer's own table by an index of its own (Swin's
``relative_position_bias_table[relative_position_index]``, LeViT's ``attention_biases[:, idxs]``, an
``nn.Embedding`` called on ``rel_pos_indices``): the bias b[h, i, j] the layer adds to head h's scores,
read as a :class:`mha.scoring.PositionBias` the oracle adds as the layer's tables say, kept as they are.

Read only where three things agree: a floating tensor with an axis of H entries (the table), an
integer buffer (N, N) whose entries index its other axis (the index), and the forward's source
indexing the one by the other, its index sliced to the sequence (MONAI's
``relative_position_index.clone()[:n, :n]``). Positions i, j < N have an entry, a longer sequence has
none: the layer is drawn with lengths up to N. A layer whose index is not sliced takes N positions
and no other (Swin's, TinyViT's): its table stays a step the oracle does not model, named as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from mha_verify.mha.scoring import PositionBias


@dataclass(frozen=True)
class GatheredBias:
    """The table and its index, by their names under the layer.

    heads_first: the table is (H, M) (LeViT's, indexed as ``table[:, index]``); otherwise (M, H).
    embedding: the table is an ``nn.Embedding``'s weight, the layer calls the embedding on the index.
    """

    table: str
    index: str
    heads_first: bool
    embedding: bool
    length: int

    def bias(self, module: nn.Module, lq: int, lk: int) -> torch.Tensor:
        """(H, Lq, Lk): the layer's table at its index's first Lq rows and Lk columns, read live (the
        harness redraws the layer's weights after this is read)."""
        owner = module.get_submodule(self.table) if self.embedding else None
        table = owner.weight if isinstance(owner, nn.Embedding) else getattr(module, self.table)
        index = getattr(module, self.index)[:lq, :lk]
        if self.heads_first:
            return table[:, index]  # (H, Lq, Lk)
        return table[index].permute(2, 0, 1)  # (Lq, Lk, H) -> (H, Lq, Lk)

    def position_bias(self, module: nn.Module) -> PositionBias:
        return PositionBias(table=lambda lq, lk: self.bias(module, lq, lk),
                            source=f"its table {self.table} gathered by its index {self.index}")


def _indexes(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The layer's own integer buffers (N, N) with N >= 2, by name (its direct attributes)."""
    return [(name, b) for name, b in module.named_buffers(recurse=False)
            if b.dim() == 2 and b.shape[0] == b.shape[1] >= 2 and not b.dtype.is_floating_point
            and b.dtype != torch.bool and b.numel() and int(b.min()) >= 0]


def _tables(module: nn.Module, heads: int) -> list[tuple[str, torch.Tensor, bool]]:
    """(name, table, embedding) of each floating tensor (M, H) or (H, M) the layer holds itself: a
    parameter of its own or an embedding child's weight."""
    found: list[tuple[str, torch.Tensor, bool]] = [
        (name, p, False) for name, p in module.named_parameters(recurse=False) if p.dim() == 2 and heads in p.shape]
    found += [(name, child.weight, True) for name, child in module.named_children()
              if isinstance(child, nn.Embedding) and child.weight.shape[1] == heads]
    return found


def _indexed_in(source: str, table: str, index: str, embedding: bool) -> bool:
    """Whether ``source`` indexes (or, for an embedding, calls) ``table`` by ``index`` sliced to the
    sequence (``index[:n, :n]``, through a ``.clone()`` or the like)."""
    opener = r"\(" if embedding else r"\[\s*(?::\s*,\s*)?"
    sliced = r"(?:\.\w+\([^()]*\))*\[\s*:\s*\w+\s*,\s*:\s*\w+\s*\]"
    return re.search(rf"\b{re.escape(table)}\s*{opener}\s*(?:self\.)?{re.escape(index)}\b{sliced}", source) \
        is not None


def read_gathered_bias(module: nn.Module, heads: int, source: str) -> GatheredBias | None:
    """The gathered relative-position bias of ``module`` (``heads`` heads, its forward's ``source``),
    or None where its tensors and source do not say one."""
    if heads < 1:
        return None
    for index_name, index in _indexes(module):
        top = int(index.max())
        for table_name, table, embedding in _tables(module, heads):
            heads_first = not embedding and table.shape[0] == heads and table.shape[1] != heads
            entries = table.shape[1] if heads_first else table.shape[0]
            if top < entries and _indexed_in(source, table_name, index_name, embedding):
                return GatheredBias(table_name, index_name, heads_first, embedding, index.shape[0])
    return None


def table_parameters(module: nn.Module, found: GatheredBias) -> list[torch.Tensor]:
    """The parameters the gathered bias reads (its table), which are then no step beyond the oracle's."""
    owner = module.get_submodule(found.table) if found.embedding else None
    table = owner.weight if isinstance(owner, nn.Embedding) else getattr(module, found.table)
    return [table] if isinstance(table, torch.Tensor) else []
