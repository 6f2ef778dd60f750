"""An attention core: a layer with no projections of its own whose forward takes queries, keys and
values already split into heads (kornia's LoFTR ``FullAttention``, LightGlue's ``Attention``,
vit-pytorch's ``Attend``): the step libraries factor out of their attention layers.

Such a class is verified inside projections the harness gives it (:class:`CoreInProjections`):
``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` of width D, drawn like any layer's weights, the heads
split in the layout its source names, the core called on them, the heads merged back. The oracle then
holds the core to softmax(q k^T / sqrt(Hd)) v per head, its only code under test. The layout of the
heads is read from the core's first ``einsum`` (``"nlhd,nshd->nlsh"``: (B, L, H, Hd)); where none is
written, SDPA's (B, H, L, Hd).

Shapes: the wrapper takes query (B, Lq, D), key and value (B, Lk, D) and gives (B, Lq, D); the core
gets (B, H, L, Hd) or (B, L, H, Hd) and gives the same layout back.
"""

from __future__ import annotations

import inspect
import re

import torch
from torch import nn

from mha_verify.properties.adapters.forward_source import forward_sources
from mha_verify.properties.adapters.library_facts import other_operator

#: the names a core's forward gives its first three parameters: query, key, value
CORE_NAMES = (("q", "query", "queries"), ("k", "key", "keys"), ("v", "value", "values"))
#: the layouts of a core's per-head inputs
LAYOUTS = {"BHLD": "(B, H, L, Hd)", "BLHD": "(B, L, H, Hd)"}
_EINSUM = re.compile(r"einsum\(\s*['\"]\s*([a-z ]+?)\s*,")
_COMPUTES = re.compile(r"\bsoftmax\b|scaled_dot_product_attention")


def takes_heads(cls: type) -> bool:
    """Whether ``cls.forward``'s first three parameters are named query, key and value (in that
    order): a core, where the class also has no parameters once built (:func:`core_module`)."""
    try:
        params = list(inspect.signature(getattr(cls, "forward")).parameters.values())[1:]  # noqa: B009
    except (TypeError, ValueError):
        return False
    names = [p.name for p in params[:3] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(names) == 3 and all(name in spelled for name, spelled in zip(names, CORE_NAMES, strict=True))


def unfed(cls: type) -> tuple[str, ...]:
    """The parameters of a core's forward after q, k, v that the wrapper does not give (its masks, a
    bias): where a core lays them out is not read, so it is called with their defaults."""
    try:
        params = list(inspect.signature(getattr(cls, "forward")).parameters.values())[4:]  # noqa: B009
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def core_layout(cls: type) -> tuple[str, str]:
    """(layout, how it was read) of the core's per-head inputs: from the first operand of its first
    ``einsum`` where that names four axes with ``h`` among them, else SDPA's (B, H, L, Hd)."""
    try:
        source = inspect.getsource(getattr(cls, "forward"))  # noqa: B009
    except (OSError, TypeError):
        source = ""
    found = _EINSUM.search(source)
    spec = found.group(1).replace(" ", "") if found else ""
    if len(spec) == 4 and spec[2] == "h":
        return "BLHD", f"`{found.group(0) if found else ''}` in its forward"
    if len(spec) == 4 and spec[1] == "h":
        return "BHLD", f"`{found.group(0) if found else ''}` in its forward"
    return "BHLD", "SDPA's, its forward naming no other"


def core_module(core: nn.Module) -> None:
    """ValueError naming what makes ``core`` no attention core the harness can hold to the oracle: a
    parameter of its own, a forward that computes no softmax, a scoring other than softmax's."""
    name = type(core).__name__
    own = [n for n, _ in core.named_parameters()]
    if own:
        raise ValueError(f"{name}'s forward takes q, k, v, but it has parameters of its own ({', '.join(own[:3])}): "
                         "no attention core the harness can wrap in projections")
    other = other_operator(core)
    if other:
        raise ValueError(f"{name}'s forward {other}, a step beyond the attention the oracle models, so it cannot be "
                         "verified as an attention core")
    text = "\n".join(source for _, source in forward_sources(core))
    if not _COMPUTES.search(text):
        raise ValueError(f"{name}'s forward takes q, k, v and computes no softmax the harness can read: "
                         "no attention core it can hold to the oracle")


def in_projections(core: nn.Module, d_model: int, n_head: int) -> CoreInProjections | None:
    """``core`` inside the harness's projections where it is an attention core (its forward takes q, k, v
    and it has no parameters), its declared conventions (``mha_verify_conventions``) kept; None where it is
    no core. A factory's module is wrapped so (``LocalAttention(window_size=128, autopad=True)``), a class
    the construction plans build. ValueError from :func:`core_module` where it takes q, k, v and cannot be
    held to the oracle."""
    if not takes_heads(type(core)) or any(True for _ in core.parameters()):
        return None
    core_module(core)
    wrapped = CoreInProjections(core, d_model, n_head, core_layout(type(core))[0])
    declared = getattr(core, "mha_verify_conventions", None)
    if declared is not None:
        wrapped.mha_verify_conventions = declared
    return wrapped


def describe_core(call: str, cls: type, d_model: int) -> str:
    """How a core was built, in words: ``call`` inside the harness's projections, its heads' layout and the
    arguments of its forward it is not given."""
    layout, how = core_layout(cls)
    left = unfed(cls)
    return (f"{call} inside projections the harness gives it (q_proj, k_proj, v_proj, out_proj of width {d_model}; "
            f"heads laid out {LAYOUTS[layout]}, {how}"
            + (f"; its {', '.join(left)} not given: where a core lays {'them' if len(left) > 1 else 'it'} "
               "out is not read" if left else "") + ")")


class CoreInProjections(nn.Module):
    """``core`` inside projections the harness gives it (see the module docstring)."""

    mha_verify_conventions: object = None

    def __init__(self, core: nn.Module, d_model: int, n_head: int, layout: str) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} is not a multiple of n_head={n_head}")
        self.core, self.n_head, self.layout = core, n_head, layout
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, d = t.shape
        t = t.view(b, n, self.n_head, d // self.n_head)
        return t.transpose(1, 2) if self.layout == "BHLD" else t

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(query)), self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        out = self.core(q, k, v)
        out = out[0] if isinstance(out, tuple) else out
        if out.shape != q.shape[:-1] + v.shape[-1:]:
            raise ValueError(f"{type(self.core).__name__} gave {tuple(out.shape)} for heads laid out "
                             f"{LAYOUTS[self.layout]} as {tuple(q.shape)}: not the layout it was given")
        merged = out.transpose(1, 2) if self.layout == "BHLD" else out
        return self.out_proj(merged.reshape(query.shape[0], query.shape[1], -1))


__all__ = ["CORE_NAMES", "LAYOUTS", "CoreInProjections", "core_layout", "core_module", "describe_core",
           "in_projections", "takes_heads", "unfed"]
