"""The KV cache a layer's forward takes, and prefill plus decode through it.

One protocol is driven: a transformers ``Cache`` handed to the forward (``cache`` in transformers 5,
``past_key_values`` or ``past_key_value`` before; any argument annotated ``Cache``, GPT-NeoX's
``layer_past``), which the layer fills through
``cache.update(k, v, self.layer_idx)``: HF's layers and any layer written the same way. Each chunk is
the next positions of one sequence; the layer sees the cache the earlier chunks filled.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

import torch
from torch import nn

#: the forward's argument names for a transformers Cache, newest first
CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value")


def cache_argument(module: nn.Module) -> str | None:
    """The forward's argument that takes a transformers Cache, where the layer also has the int
    ``layer_idx`` the cache is indexed by; None otherwise (no cache the harness can drive)."""
    layer_idx = getattr(module, "layer_idx", None)
    if not isinstance(layer_idx, int) or isinstance(layer_idx, bool) or layer_idx < 0:
        return None
    return _cache_parameter(type(module).forward)


@functools.lru_cache(maxsize=256)
def _cache_parameter(forward: Callable[..., object]) -> str | None:
    """The cache parameter of a forward function, read once per function (conventions are read at every call)."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return None
    named = next((name for name in CACHE_ARGUMENTS if name in params), None)
    if named is not None:
        return named
    return next((name for name, p in params.items() if "Cache" in str(p.annotation)), None)


class KVCache:
    """The transformers ``Cache`` protocol a layer calls, for when transformers does not import: per
    layer index, keys and values (B, Hkv, L, Hd) appended along the sequence axis by ``update``, which
    returns every position held; ``get_seq_length`` is how many that is."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: object = None) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx in self._held:
            k, v = self._held[layer_idx]
            key_states, value_states = torch.cat([k, key_states], dim=-2), torch.cat([v, value_states], dim=-2)
        self._held[layer_idx] = (key_states, value_states)
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        held = self._held.get(layer_idx)
        return 0 if held is None else int(held[0].shape[-2])


def new_cache() -> object:
    """An empty transformers ``DynamicCache`` (the cache ``generate`` starts from); a :class:`KVCache`
    where transformers does not import (a layer written to its protocol without it)."""
    try:
        from transformers import DynamicCache
    except ImportError:
        return KVCache()
    return DynamicCache()


def run_chunks(x: torch.Tensor, chunks: Sequence[int],
               call: Callable[[torch.Tensor, int, object], torch.Tensor]) -> torch.Tensor:
    """x (B, L, D) through one cache in ``chunks`` (sizes summing to L): ``call(chunk (B, C, D), start,
    cache) -> (B, C, D)``, the outputs concatenated (B, L, D)."""
    if sum(chunks) != x.shape[1] or any(c < 1 for c in chunks):
        raise ValueError(f"chunks {tuple(chunks)} do not cover the {x.shape[1]} positions of x")
    cache, outs, start = new_cache(), [], 0
    for size in chunks:
        outs.append(call(x[:, start:start + size].contiguous(), start, cache))  # as a model hands a chunk over
        start += size
    return torch.cat(outs, dim=1)


__all__ = ["CACHE_ARGUMENTS", "KVCache", "cache_argument", "new_cache", "run_chunks"]
