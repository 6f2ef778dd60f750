"""A convolution over positions right after a projection (Primer-EZ's depthwise convolution of q, k
and v: ``self.query = nn.Sequential(self.query, SpatialDepthWiseConvolution(d_k))``): the projection's
weights are read as any other's, and the convolution is a step of its own the oracle does not model.

Such a layer is verified by the laws alone, and two kinds of them need more than that:

* the laws about a masked key (its k and v change nothing, no gradient reaches them) do not hold,
  and are not meant to: the convolution carries each position into its neighbours' q, k and v
  before any mask, which removes a key from the scores only;
* the causal laws hold only where the convolution reaches no position from a later one. Which
  side it pads is read by a probe of the projection itself (:func:`reaches_back`), not from its
  padding arguments: labml writes the same causal convolution as a ``Conv1d`` trimmed at its end
  and as a loop over shifted kernels.
"""

from __future__ import annotations

import re
import weakref

import torch
from torch import nn

#: a child named for a projection (``query``, ``to_k``, ``qkv``)
PROJECTION_NAME = re.compile(r"(^|_)(q|k|v|qk|kv|qkv|query|key|value)($|_)", re.IGNORECASE)
#: the probe's input: positions and items along its first two axes (distinct sizes, so that a
#: projection that took them the other way round would still be told apart)
_PROBE = (5, 3)
#: what the probe saw, per projection: conventions are read again at later calls (an exporter's trace
#: among them), where a probe must not run
_SEEN: weakref.WeakKeyDictionary[nn.Module, str | None] = weakref.WeakKeyDictionary()


def is_position_convolution(part: nn.Module) -> bool:
    """A convolution wider than one position (``Conv1d(kernel_size=3)``), or a module named for a
    convolution that holds parameters (labml's ``SpatialDepthWiseConvolution``: a loop of shifted
    kernels in its own ``kernels``)."""
    if isinstance(part, nn.modules.conv._ConvNd):
        return any(k > 1 for k in part.kernel_size)
    return "Convolution" in type(part).__name__ and any(True for _ in part.parameters())


def convolved_projections(module: nn.Module) -> dict[str, nn.Sequential]:
    """The children of ``module`` named for a projection that are an ``nn.Sequential`` of a module
    first (the projection) and then a convolution over positions (with dropouts or identities beside),
    by name."""
    found: dict[str, nn.Sequential] = {}
    for name, child in module.named_children():
        if not PROJECTION_NAME.search(name.removeprefix("to_")) or not isinstance(child, nn.Sequential) \
                or len(child) < 2:
            continue
        rest = list(child)[1:]
        if any(is_position_convolution(part) for part in rest) and all(
                is_position_convolution(part) or isinstance(part, (nn.modules.dropout._DropoutNd, nn.Identity))
                for part in rest):
            found[name] = child
    return found


def describe(convolved: dict[str, nn.Sequential]) -> str:
    """The step in words: ``a convolution over positions after its projections (query: Conv...)``."""
    parts = ", ".join(f"{name}: {type(next(p for p in list(child)[1:] if is_position_convolution(p))).__name__}"
                      for name, child in convolved.items())
    return f"a convolution over positions after its projections ({parts})"


def reaches_back(projection: nn.Sequential) -> str | None:
    """Where the projection followed by its convolution reaches a position from a later one, what the
    probe saw; None where it reaches none.

    The probe: an input (5, 3, D), D the projection's input width; one entry of it changed at a time,
    along each of its first two axes in turn (whichever the layer takes for positions), and the
    output compared along the same axis before it. An output that does not keep those two axes, or a
    probe that raises, is reported as such (not causal as far as the harness can tell).
    """
    if projection not in _SEEN:
        _SEEN[projection] = _probe(projection)
    return _SEEN[projection]


def _probe(projection: nn.Sequential) -> str | None:
    widths = [getattr(m, "in_features", None) for m in projection[0].modules()]
    width = next((w for w in widths if isinstance(w, int)), None)
    first = next(projection.parameters(), None)
    if width is None or first is None:
        return "its projection's input width could not be read, so no probe of it ran"
    shape: tuple[int, int, int] = (*_PROBE, width)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(first)
    was = projection.training
    projection.eval()
    try:
        with torch.no_grad():
            base = projection(x)
            if not isinstance(base, torch.Tensor) or tuple(base.shape[:2]) != _PROBE:
                got = tuple(base.shape) if isinstance(base, torch.Tensor) else type(base).__name__
                return f"a probe on an input {shape} gave {got}, which does not keep its first two axes"
            scale = float(base.abs().max()) + 1.0
            for axis in (0, 1):
                for j in range(1, shape[axis]):
                    y = x.clone()
                    y.select(axis, j).add_(1.0)
                    moved = (projection(y) - base).abs().movedim(axis, 0).reshape(shape[axis], -1).amax(dim=1)
                    before = moved[:j]
                    if float(before.max()) > 1e-5 * scale:
                        return (f"a probe changing entry {j} along axis {axis} of an input {shape} moved its "
                                f"output at entry {int(before.argmax())} by {float(before.max()):.3g}")
    except Exception as exc:  # a projection that does not take the probe is reported, not raised
        return f"a probe on an input {shape} raised {type(exc).__name__}: {exc}"
    finally:
        projection.train(was)
    return None
