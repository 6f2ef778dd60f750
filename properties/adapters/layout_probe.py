"""Which axis of a layer's inputs is the batch, read by running it once: names cannot tell (fairseq's
``query`` is (T, B, C), HF's ``hidden_states`` (B, L, D)), and a probe with q = k = v of two equal
axes cannot either.

The probe x has axes of 2 and 3: one element, x[0, 1], is changed (its features reversed). Attention
mixes positions and never batch items, so a batch-first layer changes its output of item 0 only
(out[0, :]), a sequence-first one its output of item 1 only (out[:, 1]). Anything else (no change,
both) is read as batch-first, the harness's default, and can be declared otherwise.

A layer that cannot be called on (A0, A1, D) at all may take a 4-D input (SAM's image encoder a feature
map (B, H, W, C), fair-esm's axial layers an alignment (R, C, B, D), MobileViT patches (B, P, N, D)).
It is probed at (2, 3, 5, D) with x[1, 1, 1] changed: the axes along which other outputs move are the
ones it attends along, the others are batch-like. A sequence (B, L, D) is then given as one row of
such an input (:data:`protocol.GRID_LAYOUTS`): L along an attended axis, B along a batch-like one,
the third axis 1; the first placement whose own probe attends along L (an output other than the
changed one moves) and keeps the batch items apart is taken. A layer that takes no such input is probed
the same way as a channels-first feature map (2, D, 3, 5) (vit-pytorch's NesT and ScalableViT attend over
(B, C, H, W) through 1x1 convolutions): a sequence is then (B, D, 1, L). The axes are read from what the
layer does, never from its names.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn

from mha_verify.properties.protocol import CHANNELS_FIRST, GRID_LAYOUTS

_READ: weakref.WeakKeyDictionary[nn.Module, tuple[str, str]] = weakref.WeakKeyDictionary()
#: a layout other than batch-first, read with evidence at some size, per class: at a size where the
#: probe sees nothing move (D = 1 behind a LayerNorm, which gives its bias whatever the input) the
#: class's layout is still what its code takes
_BY_CLASS: weakref.WeakKeyDictionary[type, tuple[str, str]] = weakref.WeakKeyDictionary()


def _changed(features: torch.Tensor) -> torch.Tensor:
    """One position's features (..., D) changed so that any layer sees it: reversed, not shifted (a layer
    that normalizes its input over D first sees no shift, and at D = 2 a LayerNorm keeps only the sign of
    x0 - x1, which a reversal flips)."""
    return features.flip(-1) if features.shape[-1] > 1 else features + 1.0


def _probe_sizes(d_model: int) -> tuple[int, int]:
    """The probe's two axes, sizes other than D: at (2, 3, D = 3) a channels-first layer takes the middle
    3 for its channels and runs, read as batch-first."""
    first, second = tuple(n for n in (2, 3, 5, 7) if n != d_model)[:2]
    return first, second


def _moved(run: Callable[[torch.Tensor], torch.Tensor], d_model: int, dtype: torch.dtype) -> torch.Tensor | None:
    """(A0, A1) bool (:func:`_probe_sizes`): which outputs moved when x[0, 1] did, or None where the output is
    not (A0, A1, *)."""
    sizes = _probe_sizes(d_model)
    x = torch.randn(*sizes, d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    y = x.clone()
    y[0, 1] = _changed(x[0, 1])
    with torch.no_grad():
        before, after = run(x), run(y)
    if before.dim() < 2 or tuple(before.shape[:2]) != sizes or after.shape != before.shape:
        return None
    return (after.double() - before.double()).abs().flatten(2).amax(dim=-1) > 0


def to_layer(t: torch.Tensor, layout: str) -> torch.Tensor:
    """q, k or v (B, L, D) in ``layout`` (:data:`protocol.LAYOUTS`): transposed, or one row of a 4-D input."""
    if layout == "seq_first":
        return t.transpose(0, 1)
    if layout == CHANNELS_FIRST:
        return t.transpose(1, 2)
    if layout in GRID_LAYOUTS:
        return t.unsqueeze(2).permute(*("BL1D".index(axis) for axis in layout))  # (B, L, 1, D) -> layout
    return t


def from_layer(out: torch.Tensor, layout: str) -> torch.Tensor:
    """An output in ``layout`` as (B, L, D): :func:`to_layer` undone."""
    if layout == "seq_first":
        return out.transpose(0, 1)
    if layout == CHANNELS_FIRST:
        return out.transpose(1, 2)
    if layout in GRID_LAYOUTS:
        return out.permute(*(layout.index(axis) for axis in "BL1D"))[:, :, 0]
    return out


def _moved_grid(run: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...], at: tuple[int, ...],
                dtype: torch.dtype) -> torch.Tensor | None:
    """Which outputs (``shape`` less D, bool) moved when x[at] did, for x of ``shape``; None where the
    output is not of x's shape but for D, or the layer refuses the input."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    y = x.clone()
    y[at] = _changed(x[at])
    try:
        with torch.no_grad():
            before, after = run(x), run(y)
    except Exception:
        return None
    if not isinstance(before, torch.Tensor) or before.dim() != len(shape) \
            or tuple(before.shape[:-1]) != shape[:-1] or after.shape != before.shape:
        return None
    return (after.double() - before.double()).abs().amax(dim=-1) > 0


def _channels_first(run: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``run`` of a layer taking (A0, D, A1, A2) called on (A0, A1, A2, D), its output moved back alike."""
    def moved(x: torch.Tensor) -> torch.Tensor:
        out = run(x.movedim(-1, 1))
        return out.movedim(1, -1) if isinstance(out, torch.Tensor) and out.dim() == 4 else out
    return moved


def _sequence_channels_first(run: Callable[[torch.Tensor], torch.Tensor], d_model: int,
                             dtype: torch.dtype) -> tuple[str, str] | None:
    """``(CHANNELS_FIRST, how)`` for a layer that takes a sequence as (B, D, L) (a 1-D U-Net's attention over
    1x1 ``Conv1d`` projections): probed as :func:`_moved` with x given channels first, read where changing
    x[0, :, 1] moved other outputs of item 0 and none of item 1; None otherwise."""
    def moved_run(x: torch.Tensor) -> torch.Tensor:
        out = run(x.transpose(1, 2))
        return out.transpose(1, 2) if isinstance(out, torch.Tensor) and out.dim() == 3 else out
    try:
        moved = _moved(moved_run, d_model, dtype)
    except Exception:
        return None
    if moved is None or bool(moved[1:].any()) or not bool(moved[0, 0] or moved[0, 2:].any()):
        return None
    a0, a1 = _probe_sizes(d_model)
    return CHANNELS_FIRST, (f"channels first (B, D, L), read by a probe: given as ({a0}, D, {a1}), changing "
                            "x[0, :, 1] moved outputs of item 0 only, at other positions too")


def _grid(run: Callable[[torch.Tensor], torch.Tensor], d_model: int, dtype: torch.dtype) -> tuple[str, str] | None:
    """The grid layout (module docstring) of a layer that takes a 4-D input, features last or else second
    (a channels-first feature map), with how it was read; None where it takes neither or attends along no
    axis apart from the others."""
    # axes of sizes other than D: at (2, 3, 5, 3) a channels-first layer takes the last 3 for its channels
    sizes = tuple(n for n in (2, 3, 5, 7) if n != d_model)[:3]
    found = _grid_features_last(run, d_model, dtype, sizes)
    if found is not None:
        layout, attended = found
        return layout, (f"4-D inputs ({', '.join(layout)}): a sequence as one row, read by a probe: at "
                        f"({', '.join(map(str, sizes))}, D) changing x[1, 1, 1] moved outputs along axes "
                        f"{', '.join(map(str, attended))} only")
    found = _grid_features_last(_channels_first(run), d_model, dtype, sizes)
    if found is None:
        return None
    last, attended = found
    layout = last[0] + "D" + last[1:3]  # (A0, A1, A2, D) as the layer takes it: (A0, D, A1, A2)
    axes = ", ".join(str(a if a == 0 else a + 1) for a in attended)
    return layout, (f"4-D inputs ({', '.join(layout)}): a sequence as one row of a channels-first feature map, "
                    f"read by a probe: at ({sizes[0]}, D, {sizes[1]}, {sizes[2]}) changing x[1, :, 1, 1] moved "
                    f"outputs along axes {axes} only")


def _grid_features_last(run: Callable[[torch.Tensor], torch.Tensor], d_model: int, dtype: torch.dtype,
                        sizes: tuple[int, ...]) -> tuple[str, list[int]] | None:
    """:func:`_grid` for a layer whose input's last axis is D, probed at (``sizes``, D): (its layout, the
    axes it attends along)."""
    moved = _moved_grid(run, (*sizes, d_model), (1, 1, 1), dtype)
    if moved is None or not bool(moved[1, 1, 1]):
        return None
    hits = moved.nonzero()  # (n, 3): the outputs that moved
    attended = [a for a in range(3) if bool((hits[:, a] != 1).any())]
    batch_like = [a for a in range(3) if a not in attended]
    n_batch, n_len = sizes[0], sizes[1]
    for seq in reversed(attended):  # the last attended axis first: a feature map's row-major W
        for batch in batch_like:
            layout = "".join("L" if a == seq else "B" if a == batch else "1" for a in range(3)) + "D"
            shape = (*(n_len if c == "L" else n_batch if c == "B" else 1 for c in layout[:3]), d_model)
            at = tuple(1 if c == "L" else 0 for c in layout[:3])
            seen = _moved_grid(run, shape, at, dtype)
            if seen is None:
                continue
            rows = from_layer(seen[..., None], layout)[..., 0]  # (n_batch, n_len): item, position
            others = torch.cat([rows[0, :1], rows[0, 2:]])
            if bool(others.any()) and not bool(rows[1:].any()):
                return layout, attended
    return None


def read_layout(module: nn.Module, run: Callable[[torch.Tensor], torch.Tensor], d_model: int,
                dtype: torch.dtype) -> tuple[str, str]:
    """(a layout of :data:`protocol.LAYOUTS`, how it was read) for ``module``, whose forward ``run`` calls
    as self-attention on x (A0, A1, D), or (A0, A1, A2, D), in the layer's own layout; read once per
    module, in eval mode with torch's random state restored."""
    if module in _READ:
        return _READ[module]
    if torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing():
        return "batch_first", ""  # never a probe call inside a trace: the layout was read before it
    training = module.training
    grid = None
    try:
        module.eval()
        with torch.random.fork_rng(devices=[]):
            try:
                moved = _moved(run, d_model, dtype)
            except Exception:  # a forward that takes no (A0, A1, D): perhaps a 4-D input
                moved = None
                grid = _grid(run, d_model, dtype) or _sequence_channels_first(run, d_model, dtype)
    finally:
        module.train(training)
    layout = ("seq_first", "sequence first (L, B, D), read by a probe: changing x[0, 1] moved only the outputs "
              "[:, 1]") if moved is not None and bool(moved[:, 1].any()) and not bool(
        moved[:, 0].any() or moved[:, 2:].any()) and bool(moved[1:].any()) else grid or ("batch_first", "")
    if layout[0] != "batch_first":
        _BY_CLASS[type(module)] = layout
    elif moved is None and type(module) in _BY_CLASS:  # it takes no (A0, A1, D), and no probe read it here
        layout = _BY_CLASS[type(module)]
    _READ[module] = layout
    return layout


__all__ = ["from_layer", "read_layout", "to_layer"]
