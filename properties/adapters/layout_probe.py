"""Which axis of a layer's inputs is the batch, read by running it once: names cannot tell (fairseq's
``query`` is (T, B, C), HF's ``hidden_states`` (B, L, D)), and a probe with q = k = v of two equal
axes cannot either.

The probe x has axes of 2 and 3: one element, x[0, 1], is changed. Attention mixes positions and never
batch items, so a batch-first layer changes its output of item 0 only (out[0, :]), a sequence-first
one its output of item 1 only (out[:, 1]). Anything else (no change, both, a layer the probe cannot
call with x alone) is read as batch-first, the harness's default, and can be declared otherwise.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn

_READ: weakref.WeakKeyDictionary[nn.Module, tuple[str, str]] = weakref.WeakKeyDictionary()


def _moved(run: Callable[[torch.Tensor], torch.Tensor], d_model: int, dtype: torch.dtype) -> torch.Tensor | None:
    """(2, 3) bool: which outputs moved when x[0, 1] did, or None where the output is not (2, 3, *)."""
    x = torch.randn(2, 3, d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    y = x.clone()
    y[0, 1] += 1.0
    with torch.no_grad():
        before, after = run(x), run(y)
    if before.dim() < 2 or tuple(before.shape[:2]) != (2, 3) or after.shape != before.shape:
        return None
    return (after.double() - before.double()).abs().flatten(2).amax(dim=-1) > 0


def read_layout(module: nn.Module, run: Callable[[torch.Tensor], torch.Tensor], d_model: int,
                dtype: torch.dtype) -> tuple[str, str]:
    """("batch_first" | "seq_first", how it was read) for ``module``, whose forward ``run`` calls as
    self-attention on x (A0, A1, D) in the layer's own layout; read once per module, in eval mode with
    torch's random state restored."""
    if module in _READ:
        return _READ[module]
    if torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing():
        return "batch_first", ""  # never a probe call inside a trace: the layout was read before it
    training = module.training
    try:
        module.eval()
        with torch.random.fork_rng(devices=[]):
            moved = _moved(run, d_model, dtype)
    except Exception:  # a forward that needs more than x: the default, declarable
        moved = None
    finally:
        module.train(training)
    layout = ("seq_first", "sequence first (L, B, D), read by a probe: changing x[0, 1] moved only the outputs "
              "[:, 1]") if moved is not None and bool(moved[:, 1].any()) and not bool(
        moved[:, 0].any() or moved[:, 2].any()) and bool(moved[1].any()) else ("batch_first", "")
    _READ[module] = layout
    return layout


__all__ = ["read_layout"]
