"""The ordered registry of adapters: which adapter sees a layer, and how users add their own.

Automatic selection asks each registered adapter in order whether it ``matches`` a layer;
the first that does is used. The built-in order: the exact adapters (torch MHA, then the
seeds' and our naming), then those that recognize library layers by structure
(``properties.adapters.structural``, ``properties.adapters.projections``).

Users extend it three ways: ``--adapter pkg.mod:Name`` (or ``path/to/file.py:Name``) for one
run; :func:`register` from their own code; or an entry point in the group
``mha_verify.adapters`` (its object an Adapter subclass or instance), registered before the
built-in structural adapters so that a package's own adapter wins over a guess by structure.
"""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points

from torch import nn

from mha_verify.properties.adapters.base import (
    Adapter,
    LinearQKVAdapter,
    QKVAdapter,
    QueryKeyValueAdapter,
    TorchMHAAdapter,
)
from mha_verify.properties.adapters.by_shape import ByShapeAdapter
from mha_verify.properties.adapters.forward_source import forward_sources
from mha_verify.properties.adapters.library_facts import other_operator
from mha_verify.properties.adapters.projections import STRUCTURAL
from mha_verify.properties.adapters.unmodelled import convolution_projections, step_without_adapter
from mha_verify.properties.adapters.wrapped_mha import WrappedTorchMHAAdapter
from mha_verify.properties.loading import load_attr
from mha_verify.properties.protocol import Conventions, TargetError

ENTRY_POINT_GROUP = "mha_verify.adapters"

_EXACT: tuple[Adapter, ...] = (TorchMHAAdapter(), QKVAdapter(), QueryKeyValueAdapter(), LinearQKVAdapter())
#: names first; shapes last, where no naming fits
_REGISTRY: list[Adapter] = [*_EXACT, WrappedTorchMHAAdapter(), *STRUCTURAL, ByShapeAdapter()]
_entry_points_loaded = False
_entry_point_error: str | None = None


def _checked(obj: object, source: str) -> Adapter:
    """An Adapter instance from ``obj`` (a subclass is instantiated), its declaration checked now:
    an unknown key is a usage error up front, not a failure of every property."""
    if inspect.isclass(obj) and issubclass(obj, Adapter):
        obj = obj()
    if not isinstance(obj, Adapter):
        raise ValueError(f"{source} is a {type(obj).__name__}, not a mha_verify.properties.adapters.Adapter subclass")
    if obj.mha_verify_conventions:
        Conventions().declare(obj.mha_verify_conventions, source=f"{type(obj).__name__}.mha_verify_conventions")
    return obj


def register(adapter: Adapter | type[Adapter], *, first: bool = False) -> Adapter:
    """Add ``adapter`` to automatic selection: before every built-in adapter with ``first``, else
    before the structural ones (after the exact ones). ValueError if its name is taken."""
    obj = _checked(adapter, f"register({adapter!r})")
    if any(a.name == obj.name for a in _REGISTRY):
        raise ValueError(f"an adapter named {obj.name!r} is registered already")
    _REGISTRY.insert(0 if first else len(_EXACT), obj)
    return obj


def _load_entry_points() -> None:
    """Register the adapters installed packages declare. One that cannot be loaded is a usage
    error naming it, on this call and every later one: the gate never goes on with the rest of
    the registry as if the broken adapter had not been asked for."""
    global _entry_points_loaded, _entry_point_error
    if _entry_point_error is not None:
        raise ValueError(_entry_point_error)
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register(ep.load())
            continue
        except SystemExit as exc:  # sys.exit() while imported: without this the gate ended green, silent
            why = f"called sys.exit({exc.code!r}) while loading"
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        first_line = (why.strip().splitlines() or [""])[0][:300]
        _entry_point_error = f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}): {first_line}"
        raise ValueError(_entry_point_error)


def adapters() -> tuple[Adapter, ...]:
    """Every registered adapter, in matching order."""
    _load_entry_points()
    return tuple(_REGISTRY)


_LOADED: dict[str, Adapter] = {}


def load_adapter(spec: str) -> Adapter:
    """A user's adapter from ``pkg.mod:Name`` or ``path/to/file.py:Name``: an Adapter subclass
    (instantiated without arguments) or instance, loaded once. ValueError naming what is wrong."""
    if spec not in _LOADED:
        try:
            obj = load_attr(spec)
        except TargetError as exc:
            raise ValueError(f"--adapter {spec}: {exc}") from None
        adapter = _checked(obj, f"--adapter {spec}")
        if adapter.name == "base":
            adapter.name = spec.rpartition(":")[2]
        _LOADED[spec] = adapter
    return _LOADED[spec]


def find_adapter(module: nn.Module, name: str | None = None) -> Adapter:
    """The adapter named ``name`` (a registered name, or ``pkg.mod:Name`` for a user's), or the
    first whose structure ``module`` matches.

    Raises ValueError naming the known adapters when none applies.
    """
    known = adapters()
    if name is not None and name != "auto":
        if ":" in name:
            return load_adapter(name)
        by_name = {a.name: a for a in known}
        if name not in by_name:
            raise ValueError(f"unknown adapter {name!r}; known: {', '.join(by_name)} or pkg.mod:YourAdapter")
        return by_name[name]
    for adapter in known:
        if adapter.matches(module):
            return adapter
    convolutions = convolution_projections(module)
    if convolutions:  # attention over a feature map (B, C, H, W): no adapter reads it as (B, L, D)
        raise ValueError(f"{type(module).__name__} takes a step beyond the attention the oracle models: q, k, v "
                         f"projected by convolutions over a feature map ({', '.join(convolutions)}), attention over "
                         "(B, C, H, W) positions rather than a sequence (B, L, D), so it cannot be verified yet")
    other = other_operator(module)
    if other:  # nGPT's normalized projections compute cosine-similarity attention: no adapter reads them
        raise ValueError(f"{type(module).__name__}'s forward {other}, so it cannot be verified as attention")
    step = step_without_adapter(module, forward_sources(module))
    if step:
        raise ValueError(f"{type(module).__name__} {step}")
    # the adapters by name only: their descriptions are what `mha-verify list` prints, and the error
    # stays one readable line
    raise ValueError(
        f"no adapter recognizes {type(module).__name__} (its children: "
        f"{', '.join(n for n, _ in module.named_children()) or 'none'}); known adapters: "
        f"{', '.join(a.name for a in known)} (`mha-verify list` says what each reads); for another layout pass "
        "--adapter pkg.mod:YourAdapter (docs/conventions-and-adapters.md; examples: docs/adapters/)"
    )


def names() -> tuple[str, ...]:
    """The registered adapters' names, in matching order (for --adapter's help)."""
    return tuple(a.name for a in adapters())
