"""The head count of a layer, read from what it shows: an attribute named for it, else where the layer
splits its projections into heads.

In order: an attribute of a known name (``num_heads``, ``n_head``, ``heads``, ...); an einops
``Rearrange`` child that splits the head axis with a length of its own (``Rearrange('b n (h d) ->
b h n d', h = heads)``); the forward's source, where it names an attribute for the head axis of a
split: ``rearrange(t, 'b n (h d) -> ...', h = self.X)`` or ``.view(b, -1, self.X, self.Y)`` (the
Annotated Transformer's ``self.h`` before ``self.d_k``: heads come before the head width in every
(B, L, H, Hd) split). A name alone is not believed where the same source splits by another.
"""

from __future__ import annotations

import re

from torch import nn

from mha_verify.properties.adapters.forward_source import forward_sources
from mha_verify.properties.protocol import NotApplicable

HEAD_ATTRS = ("num_heads", "n_head", "num_attention_heads", "heads", "n_heads")

# einops keyword for the head axis: h = self.heads
_EINOPS_H = re.compile(r"['\"][^'\"]*\(h d\)[^'\"]*['\"][^)]*?\bh\s*=\s*self\.(\w+)")
# a split into heads: .view(...) / .reshape(...) whose arguments hold two attributes side by side
_SPLIT = re.compile(r"\.(?:view|reshape)\(([^()]*)\)")
_TWO_ATTRS = re.compile(r"self\.(\w+)\s*,\s*self\.(\w+)\s*$")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def n_head_of(module: nn.Module) -> int:
    """The head count ``module`` shows (module docstring); NotApplicable naming where it was looked for
    when it shows none."""
    for attr in HEAD_ATTRS:
        value = getattr(module, attr, None)
        if isinstance(value, int) and _positive_int(value):
            return value
    found = _from_rearrange(module) or _from_source(module)
    if found is not None:
        return found
    raise NotApplicable(f"{type(module).__name__} names its head count in no attribute we know "
                        f"({', '.join(HEAD_ATTRS)}) and splits no projection into heads by one")


def head_count_source(module: nn.Module) -> str | None:
    """Where the head count was read, in words, where it is not an attribute of a known name."""
    if any(_positive_int(getattr(module, attr, None)) for attr in HEAD_ATTRS):
        return None
    if _from_rearrange(module) is not None:
        return "head count from its einops split of the heads (h = ...)"
    attr = _source_attr(module)
    return f"head count from its split of the projections into heads (self.{attr})" if attr else None


def _from_rearrange(module: nn.Module) -> int | None:
    """The ``h`` of the Rearrange children that split a head axis, where they agree."""
    found = set()
    for child in module.children():
        if type(child).__name__ != "Rearrange" or not type(child).__module__.startswith("einops"):
            continue
        pattern = getattr(child, "pattern", "")
        lengths = dict(getattr(child, "axes_lengths", ()) or ())
        if isinstance(pattern, str) and "(h d)" in pattern.split("->")[0] and _positive_int(lengths.get("h")):
            found.add(int(lengths["h"]))
    return found.pop() if len(found) == 1 else None


def _source_attr(module: nn.Module) -> str | None:
    text = "\n".join(source for _, source in forward_sources(module))
    names = set(_EINOPS_H.findall(text))
    for args in _SPLIT.findall(text):
        pair = _TWO_ATTRS.search(args.strip())
        if pair is not None and all(_positive_int(getattr(module, a, None)) for a in pair.groups()):
            names.add(pair.group(1))
    names = {n for n in names if _positive_int(getattr(module, n, None))}
    return names.pop() if len(names) == 1 else None


def _from_source(module: nn.Module) -> int | None:
    attr = _source_attr(module)
    return int(getattr(module, attr)) if attr else None
