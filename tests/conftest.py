"""Shared test set-up: the Hypothesis profile (MHA_VERIFY_PROFILE, default 'ci') and small helpers."""

from __future__ import annotations

import os

import torch

from mha_verify.properties.engine import profiles

profiles.load()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # each xdist worker has a core of its own: one intra-op thread, not two workers x two threads
    torch.set_num_threads(1)


def seeded_mha(d_model: int, n_head: int, dropout: float = 0.0, seed: int = 0, **kw: object) -> torch.nn.Module:
    """The reference module with weights drawn from ``seed``, in eval mode."""
    from mha_verify.mha import MultiHeadAttention

    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_head, dropout, **kw).eval()  # type: ignore[arg-type]
