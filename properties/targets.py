"""Targets: load the attention module to verify from a SPEC and bind it to an adapter.

SPEC is ``package.module:Attr`` or ``path/to/file.py:Attr``. Attr is an nn.Module class,
built as ``Attr(d_model, n_head)`` (or ``Attr(config)`` when its first argument is named
``config``: see :func:`config_for`), or a factory ``(d_model, n_head) -> nn.Module``.
The default SPEC is the reference, ``mha_verify.mha:MultiHeadAttention``.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import math
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from mha_verify.mha.reference import MHAParams
from mha_verify.properties.adapters import Adapter, Conventions, NotApplicable, find_adapter

DEFAULT_SPEC = "mha_verify.mha:MultiHeadAttention"


class TargetError(Exception):
    """SPEC cannot be turned into an attention module (a usage error: exit code 2)."""


def _load_attr(spec: str) -> object:
    if ":" not in spec:
        raise TargetError(f"target {spec!r} must look like package.module:Attr or path/to/file.py:Attr")
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise TargetError(f"target {spec!r} must look like package.module:Attr or path/to/file.py:Attr")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise TargetError(f"target file {where!r} does not exist")
        name = f"_mha_verify_target_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise TargetError(f"target file {where!r} cannot be imported as Python")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        # the file's directory on sys.path while it is imported, so that it imports its siblings
        # (``from layers import Block`` next to model.py), as ``python path/file.py`` would allow
        folder = str(path.resolve().parent)
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise TargetError(f"importing {where!r} failed: {type(exc).__name__}: {exc}") from None
        finally:
            if added and folder in sys.path:
                sys.path.remove(folder)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:
            raise TargetError(f"cannot import {where!r}: {type(exc).__name__}: {exc}") from None
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{where!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def randomize_parameters(module: nn.Module, seed: int) -> None:
    """Redraw every parameter of ``module``, biases included, from ``seed``, at the scale of its init.

    A layer is checked with the weights it was built with otherwise, and torch MHA, GPT-2 and
    others initialize biases to 0: a bug that swaps the q and k biases, or drops one, is then
    invisible (it failed by 0.49 against 5e-6 allowed once biases were drawn). Each tensor is
    redrawn in place as N(0, s^2) with s its own standard deviation after init (so the layer
    keeps its scale: softmax neither saturates nor flattens more than it would in use); a
    tensor whose init is constant (zero biases, LayerNorm's ones) gets the mean scale of the
    layer's weight matrices. Buffers (causal masks, rotary tables) are left alone. Drawn in the
    parameter's own dtype (float32: 5x faster than drawing float64 and rounding, 22 ms against
    110 ms at d_model 1024).
    """
    params = [p for p in module.parameters() if p.is_floating_point()]
    with torch.no_grad():
        scales = [float(p.detach().float().std()) if p.numel() > 1 else 0.0 for p in params]
        matrix_scales = [x for p, x in zip(params, scales, strict=True) if p.dim() >= 2 and x > 0 and math.isfinite(x)]
        fallback = sum(matrix_scales) / len(matrix_scales) if matrix_scales else 0.02
        generator = torch.Generator().manual_seed(seed * 7919 + 17)
        for p, scale in zip(params, scales, strict=True):
            s = scale if scale > 0 and math.isfinite(scale) else fallback
            if p.device.type == "cpu":
                p.normal_(0.0, s, generator=generator)
            else:  # a CPU generator draws on the CPU
                p.copy_(torch.empty(p.shape, dtype=p.dtype).normal_(0.0, s, generator=generator))


@dataclass
class Bound:
    """One constructed target module with its adapter: the harness's view of a layer."""

    module: nn.Module
    adapter: Adapter
    d_model: int
    n_head: int
    rebuild: Callable[[], Bound]  # a fresh instance with the same weights

    def with_weights_if_any(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``with_weights`` where the target can give weights, else None."""
        if not self.conventions.weights:
            return None
        try:
            return self.with_weights(q, k, v, mask)
        except NotApplicable:
            return None

    @property
    def conventions(self) -> Conventions:
        return self.adapter.conventions(self.module)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, Lq, D), k (B, Lk, D), v (B, Lk, D), our mask convention -> (B, Lq, D)."""
        return self.adapter.call(self.module, q, k, v, mask)

    def with_weights(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``__call__``, also returning the weights (B, H, Lq, Lk); NotApplicable if it cannot."""
        return self.adapter.call_with_weights(self.module, q, k, v, mask)

    def params(self) -> MHAParams:
        return self.adapter.params(self.module)


@dataclass
class Target:
    """A loaded SPEC: builds bound modules of any size."""

    spec: str
    factory: Callable[[int, int], nn.Module]
    adapter_name: str | None = None
    randomize: bool = True  # redraw every parameter from the seed (see randomize_parameters)
    _pristine: OrderedDict[tuple[int, int, int, torch.dtype], nn.Module] = field(
        default_factory=OrderedDict, repr=False, compare=False)
    _copyable: bool = field(default=True, repr=False, compare=False)

    #: built modules kept, untouched, to be copied when the same (d_model, n_head, seed, dtype)
    #: comes again (Hypothesis repeats sizes and seeds while it mutates and shrinks, and
    #: ``Bound.rebuild`` asks for the same module): a copy costs 10 ms at d_model 1024 where
    #: construction and redrawing cost 47 ms (below PRISTINE_MIN_NUMEL parameters, d_model 128
    #: for an MHA layer, copying costs about what building does, and nothing is kept)
    PRISTINE_KEPT = 8
    PRISTINE_MIN_NUMEL = 2**16

    def build(self, d_model: int, n_head: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Bound:
        """Construct the module, redraw all its parameters from ``seed`` at the scale of its init
        (biases included), in eval mode, in ``dtype``.

        Raises TargetError if construction fails or gives something other than an nn.Module.
        """
        key = (d_model, n_head, seed, dtype)
        # the CPU generator only: torch.manual_seed also queues seeds for CUDA and XPU, recording a
        # stack trace each time they are not initialized (1.4 ms a call, 3 s of a ci gate)
        torch.default_generator.manual_seed(seed)  # left as construction would leave it, kept or not
        kept = self._pristine.get(key)
        if kept is not None:
            self._pristine.move_to_end(key)
            return self._bind(copy.deepcopy(kept), d_model, n_head, seed, dtype)
        try:
            module = self.factory(d_model, n_head)
        except Exception as exc:
            raise TargetError(
                f"building {self.spec} with (d_model={d_model}, n_head={n_head}) failed: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(module, nn.Module):
            raise TargetError(f"{self.spec} returned {type(module).__name__}, not a torch.nn.Module")
        if self.randomize:
            randomize_parameters(module, seed)
        if any(t.is_floating_point() and t.dtype != dtype for t in (*module.parameters(), *module.buffers())):
            module = module.to(dtype)
        module = module.eval()
        if self._copyable and sum(p.numel() for p in module.parameters()) >= self.PRISTINE_MIN_NUMEL:
            try:
                self._pristine[key] = copy.deepcopy(module)
            except Exception:  # a module holding something that cannot be copied: build every time
                self._copyable = False
                self._pristine.clear()
            while len(self._pristine) > self.PRISTINE_KEPT:
                self._pristine.popitem(last=False)
        return self._bind(module, d_model, n_head, seed, dtype)

    def _bind(self, module: nn.Module, d_model: int, n_head: int, seed: int, dtype: torch.dtype) -> Bound:
        try:
            adapter = find_adapter(module, self.adapter_name)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        return Bound(module, adapter, d_model, n_head, lambda: self.build(d_model, n_head, seed=seed, dtype=dtype))


CONFIG_NAMES = ("config", "cfg", "args")


def config_for(d_model: int, n_head: int) -> SimpleNamespace:
    """A config object for layers built from one (nanoGPT's ``CausalSelfAttention(config)``, HF's
    ``LlamaAttention(config, layer_idx)``), with the field names those libraries use.

    Key/value heads: half the query heads where H is even (grouped-query attention gets
    exercised), else H. Dropout 0; biases on; block size 1024 (nanoGPT's default).
    """
    kv = n_head // 2 if n_head % 2 == 0 else n_head
    return SimpleNamespace(
        n_embd=d_model, hidden_size=d_model, d_model=d_model, dim=d_model, embed_dim=d_model,
        n_head=n_head, num_attention_heads=n_head, num_heads=n_head, n_heads=n_head,
        num_key_value_heads=kv, n_kv_heads=kv, num_kv_heads=kv, head_dim=d_model // n_head,
        bias=True, attention_bias=True, qkv_bias=True, dropout=0.0, attention_dropout=0.0, attn_pdrop=0.0,
        block_size=1024, max_position_embeddings=1024, is_decoder=False, _attn_implementation="sdpa",
    )


def _takes_config(cls: type) -> bool:
    """True if ``cls.__init__``'s first parameter is named config/cfg/args and others are optional."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return False
    if not params or params[0].name not in CONFIG_NAMES:
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[1:])


def load_target(spec: str | None = None, *, adapter: str | None = None) -> Target:
    """Resolve SPEC (default: the reference) and check that it builds at a small size."""
    spec = spec or DEFAULT_SPEC
    obj = _load_attr(spec)
    if inspect.isclass(obj):
        if not issubclass(obj, nn.Module):
            raise TargetError(f"{spec} is a class but not a torch.nn.Module subclass")
        factory: Callable[[int, int], nn.Module] = obj
        if _takes_config(obj):
            cls = obj
            factory = lambda d_model, n_head: cls(config_for(d_model, n_head))  # noqa: E731
    elif callable(obj):
        factory = obj
    else:
        raise TargetError(f"{spec} is a {type(obj).__name__}, not an nn.Module class or a factory")
    target = Target(spec, factory, adapter)
    try:  # fail now, as a usage error, rather than inside every property
        target.build(8, 2).conventions  # noqa: B018 -- a declaration with an unknown key raises here
    except ValueError as exc:
        raise TargetError(str(exc)) from None
    return target
