"""Targets: load the attention module to verify from a SPEC and bind it to an adapter.

SPEC is ``package.module:Attr`` or ``path/to/file.py:Attr``. Attr is an nn.Module class,
built as ``Attr(d_model, n_head)``, or a factory ``(d_model, n_head) -> nn.Module``.
The default SPEC is the reference, ``mha:MultiHeadAttention``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mha.reference import MHAParams
from properties.adapters import Adapter, Conventions, NotApplicable, find_adapter

DEFAULT_SPEC = "mha:MultiHeadAttention"


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
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise TargetError(f"importing {where!r} failed: {type(exc).__name__}: {exc}") from None
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

    def build(self, d_model: int, n_head: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Bound:
        """Construct the module with weights drawn from ``seed``, in eval mode, in ``dtype``.

        Raises TargetError if construction fails or gives something other than an nn.Module.
        """
        torch.manual_seed(seed)
        try:
            module = self.factory(d_model, n_head)
        except Exception as exc:
            raise TargetError(
                f"building {self.spec} with (d_model={d_model}, n_head={n_head}) failed: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(module, nn.Module):
            raise TargetError(f"{self.spec} returned {type(module).__name__}, not a torch.nn.Module")
        try:
            adapter = find_adapter(module, self.adapter_name)
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        return Bound(module.to(dtype).eval(), adapter, d_model, n_head,
                     lambda: self.build(d_model, n_head, seed=seed, dtype=dtype))


def load_target(spec: str | None = None, *, adapter: str | None = None) -> Target:
    """Resolve SPEC (default: the reference) and check that it builds at a small size."""
    spec = spec or DEFAULT_SPEC
    obj = _load_attr(spec)
    if inspect.isclass(obj):
        if not issubclass(obj, nn.Module):
            raise TargetError(f"{spec} is a class but not a torch.nn.Module subclass")
        factory: Callable[[int, int], nn.Module] = obj
    elif callable(obj):
        factory = obj
    else:
        raise TargetError(f"{spec} is a {type(obj).__name__}, not an nn.Module class or a factory")
    target = Target(spec, factory, adapter)
    target.build(8, 2)  # fail now, as a usage error, rather than inside every property
    return target
