"""Generated inputs of a whole text model: batches of token ids with their attention masks.

A :class:`Batch` is drawn as a deployment sends them: 1 to 4 items, a padded length L from either
side of the block boundaries kernels tile by (8, 16, 32, 64, 128), each item with its own number of
real tokens (none: a fully padded item) padded on the right, on the left, or with holes (real
tokens scattered, as a packed or edited batch has them), token ids anywhere in the vocabulary
(its first and last id included). Positions, where the graph takes them, count real tokens
(HF's ``cumsum(mask) - 1``, 0 on padding), so left padding and holes leave a real token's
position as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

PADDING = ("right", "left", "holes")
#: padded lengths: 1, and either side of each power of two a kernel may tile by
LENGTHS = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)


@dataclass(frozen=True)
class Batch:
    """Token ids (B, L) int64, attention mask (B, L) int64 (1 real), token types (B, L), positions (B, L)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    padding: str
    seed: int

    @property
    def real(self) -> list[int]:
        """Real tokens per item."""
        return [int(n) for n in self.attention_mask.sum(dim=1)]

    def describe(self) -> str:
        b, n = self.input_ids.shape
        return (f"B={b} L={n}, padding {self.padding}, real tokens per item {self.real}, "
                f"token ids {int(self.input_ids.min())}..{int(self.input_ids.max())}, seed {self.seed}")

    def inputs(self, roles: dict[str, str]) -> dict[str, torch.Tensor]:
        """The tensors by the graph's input names (``roles``: role -> name)."""
        return {name: getattr(self, role) for role, name in roles.items()}

    def item(self, i: int, *, unpadded: bool = False) -> Batch:
        """Item ``i`` alone (B = 1); ``unpadded``: its real tokens only, in order (at least one)."""
        rows = [slice(i, i + 1)]
        if not unpadded:
            one = [t[tuple(rows)] for t in self._tensors()]
            return Batch(one[0], one[1], one[2], one[3], self.padding, self.seed)
        keep = self.attention_mask[i].bool()
        if not bool(keep.any()):
            raise ValueError(f"item {i} has no real token to keep")
        ids, types = self.input_ids[i, keep][None], self.token_type_ids[i, keep][None]
        n = ids.shape[1]
        return Batch(ids, torch.ones(1, n, dtype=torch.long), types, torch.arange(n)[None], "none", self.seed)

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return self.input_ids, self.attention_mask, self.token_type_ids, self.position_ids


def make_batch(lengths: list[int], width: int, padding: str, vocab_size: int, type_vocab_size: int,
               seed: int) -> Batch:
    """The batch of items with ``lengths`` real tokens each, padded to ``width`` on ``padding``."""
    if padding not in PADDING:
        raise ValueError(f"padding must be one of {PADDING}, got padding={padding!r}")
    if any(not 0 <= n <= width for n in lengths):
        raise ValueError(f"each item's real tokens must be within 0..{width}, got lengths={lengths}")
    gen = torch.Generator().manual_seed(seed)
    b = len(lengths)
    ids = torch.randint(0, vocab_size, (b, width), generator=gen)
    ids[0, 0], ids[-1, -1] = 0, vocab_size - 1  # the vocabulary's ends
    mask = torch.zeros(b, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        if padding == "right":
            mask[i, :n] = 1
        elif padding == "left":
            mask[i, width - n:] = 1
        else:
            mask[i, torch.randperm(width, generator=gen)[:n]] = 1
    types = torch.randint(0, type_vocab_size, (b, width), generator=gen) if type_vocab_size > 1 \
        else torch.zeros(b, width, dtype=torch.long)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0) * mask
    return Batch(ids, mask, types, positions, padding, seed)


def batches(vocab_size: int, max_length: int, type_vocab_size: int = 1, *, max_batch: int = 4,
            padding: tuple[str, ...] = PADDING, empty_items: bool = True) -> st.SearchStrategy[Batch]:
    """Batches for a model of ``vocab_size`` ids and at most ``max_length`` positions; ``empty_items``:
    whether an item may be fully padded."""
    widths = [n for n in LENGTHS if n <= max_length] or [max_length]

    @st.composite
    def draw(data: st.DrawFn) -> Batch:
        width = data(st.sampled_from(widths))
        b = data(st.integers(1, max_batch))
        # most items are padded (a partial item is what padding relations compare), some are full, and
        # a fully padded item is drawn now and then; the shrinker goes towards the first, a padded one
        kinds = ("padded",) * 3 + ("full",) + (("empty",) if empty_items else ())
        lengths = []
        for _ in range(b):
            kind = data(st.sampled_from(kinds))
            lengths.append(width if kind == "full" else 0 if kind == "empty" else
                           data(st.integers(1, max(1, width - 1))))
        side = data(st.sampled_from(padding))
        seed = data(st.integers(0, 2**16))
        return make_batch(lengths, width, side, vocab_size, type_vocab_size, seed)

    return draw()
