"""The calls a layer makes to torch's ``scaled_dot_product_attention``, recorded while it runs.

A layer that passes its keys and values straight to torch's SDPA inherits what SDPA accepts: on
CPU, torch takes a key and a value of different lengths without a mask and returns a tensor
(pytorch/pytorch#193728, open, would reject it). When such a layer accepts Lk != Lv, the defect is
torch's, not the layer's; :class:`SdpaCalls` records the shapes SDPA received, so the report shows
the call and names the function, from what ran rather than from the layer's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: where torch's acceptance of key and value of different lengths is discussed upstream
UPSTREAM = "pytorch/pytorch#193728 (open: rejects key and value of different lengths in SDPA)"


@dataclass(frozen=True)
class SdpaCall:
    """One call that returned: the shapes of query, key and value, and whether a mask was given."""

    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...]
    masked: bool

    def describe(self) -> str:
        mask = "an attn_mask" if self.masked else "attn_mask=None"
        return (f"torch.nn.functional.scaled_dot_product_attention(query {self.query}, key {self.key}, "
                f"value {self.value}, {mask})")


class SdpaCalls(TorchFunctionMode):
    """Records every call to ``F.scaled_dot_product_attention`` that returned, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[SdpaCall] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            named = dict(zip(("query", "key", "value", "attn_mask"), args, strict=False)) | kwargs
            q, k, v = (named.get(n) for n in ("query", "key", "value"))
            if all(isinstance(t, torch.Tensor) for t in (q, k, v)):
                self.calls.append(SdpaCall(tuple(q.shape), tuple(k.shape), tuple(v.shape),
                                           named.get("attn_mask") is not None))
        return out


def passed_through(calls: list[SdpaCall], lk: int, lv: int) -> SdpaCall | None:
    """The first recorded call that received the layer's key length ``lk`` and value length
    ``lv`` as given (sequence axis -2), or None."""
    return next((c for c in calls if len(c.key) >= 2 and len(c.value) >= 2 and c.key[-2] == lk and c.value[-2] == lv
                 and lk != lv), None)
