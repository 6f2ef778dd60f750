"""What replays a whole-model failure without mha_verify: the feed of one onnxruntime run, the output
it compared, what that output should have been there (float64), where it was compared, and the error
allowed. The CLI writes it as a reproduction bundle (``validate --bundle-dir``): the same files and
fixed ``replay.py`` as a layer's bundle, with ``where.npy`` selecting the compared positions."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mha_verify.properties.engine.measure import Violation


@dataclass(frozen=True)
class Replay:
    """``feed``: input name -> array, as onnxruntime took it; ``expected`` (float64) and ``where`` (bool)
    of ``output``'s shape: the failure is ``|actual - expected|`` above ``allowed`` somewhere in ``where``."""

    feed: dict[str, np.ndarray]
    output: str
    expected: np.ndarray
    where: np.ndarray
    allowed: float


class ModelViolation(Violation):
    """A relation of a whole model does not hold; ``replay`` reproduces it (None where it cannot)."""

    def __init__(self, message: str, error: float = math.inf, allowed: float = 0.0, *,
                 replay: Replay | None = None) -> None:
        super().__init__(message, error, allowed)
        self.replay = replay


def replay_of(feed: dict[str, np.ndarray], output: str, expected: torch.Tensor, where: torch.Tensor,
              allowed: float) -> Replay:
    """A :class:`Replay` of ``output`` compared with ``expected`` at ``where`` (same shapes)."""
    if expected.shape != where.shape:
        raise ValueError(f"expected and where must have one shape, got {tuple(expected.shape)} and "
                         f"{tuple(where.shape)}")
    return Replay(feed, output, expected.detach().double().numpy(), where.detach().bool().numpy(), float(allowed))


def placed(like: torch.Tensor, index: tuple[int | torch.Tensor, ...], values: torch.Tensor,
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``like``'s shape with ``values`` at ``index`` (zeros elsewhere), and where they are: the
    expected of a relation whose other side is a run of another shape (an item alone)."""
    expected = torch.zeros_like(like, dtype=torch.float64)
    where = torch.zeros_like(like, dtype=torch.bool)
    expected[index] = values.double()
    where[index] = True
    return expected, where
