"""The relations a whole exported text model is held to, each on one generated :class:`Batch`.

Every comparison uses the one tolerance rule (:mod:`mha.tolerance`): the eager model in float64 is
the oracle, the same model in the precision the export computes in (float32, or float16 for a
converted graph) gives the allowance, ``multiple * |eager_same - eager64| + floor``. A relation
between two onnxruntime runs is allowed the eager model's error on both sides.

* ``outputs_agree``: onnxruntime against the eager model on every output, at every real token of
  every item with one. A difference at padding (a padded position, a fully padded item) is a
  finding of kind "unspecified by its library": transformers leaves padded rows don't-care.
* ``padding_invariance``: a real token's outputs do not change when its item is padded, on each
  side the eager model itself keeps them on (read at load: an encoder with absolute positions keeps
  them under right padding only, and that is said).
* ``batch_independence``: an item's real tokens give the same outputs alone as in the batch.
* ``fully_padded_finite``: a fully padded item's outputs are finite.

A check returns a :class:`Measure`; ``checked`` is False where the batch held nothing to compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort
import torch
from onnx import helper

from mha_verify.mha.tolerance import compare, tolerance_for
from mha_verify.properties.engine.measure import UNCHECKED, Measure, error_line
from mha_verify.properties.model.batches import Batch, make_batch
from mha_verify.properties.model.eager import EagerModel
from mha_verify.properties.model.inputs import ModelInputs
from mha_verify.properties.model.replay import ModelViolation, placed, replay_of
from mha_verify.properties.protocol import TargetError

_NP_INT = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class ModelRaised(Exception):  # noqa: N818 -- a verdict on the model, as Violation is
    """onnxruntime or the eager model raised on a batch: the model's failure, named with where."""


@dataclass
class ModelUnderTest:
    """An onnxruntime session on the export, its input roles, and the eager model it came from.

    ``keeps``: the padding sides on which the eager model keeps real tokens' outputs (read by
    :meth:`read_claims`), with the reason for each side it does not keep."""

    session: ort.InferenceSession
    inputs: ModelInputs
    eager: EagerModel
    keeps: dict[str, str] = field(default_factory=dict)  # side -> "" (kept) or why not
    precondition: str = ""  # why the graph holds right padding only (graph_blocks.padding_precondition)
    needs_tokens: str = ""  # why every item needs a real token (graph_blocks.tokens_precondition)

    def claims(self, side: str) -> str:
        """"" where the export is held to keep real tokens' outputs under ``side`` padding, else why not."""
        if self.keeps.get(side, ""):
            return self.keeps[side]
        return self.precondition if side != "right" else ""

    def outside(self, batch: Batch) -> str:
        """Why ``batch`` is outside a precondition the graph's fused attention documents ("" where it
        is inside): real tokens not first in an item, or an item with none."""
        if self.precondition and batch.padding != "right" and any(0 < n < batch.input_ids.shape[1]
                                                                  for n in batch.real):
            return self.precondition
        if self.needs_tokens and 0 in batch.real:
            return self.needs_tokens
        return ""

    def ort(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The outputs (float64, by name) of one onnxruntime run on ``batch``, a decoder's cache empty."""
        return self.step(batch.inputs(self.inputs.roles), self.empty_cache(batch.input_ids.shape[0]))[0]

    def feed(self, tensors: dict[str, torch.Tensor], past: dict[str, np.ndarray] | None = None,
             ) -> dict[str, np.ndarray]:
        """The arrays onnxruntime is fed for ``tensors`` (by input name, in the graph's integer type)
        and the cache ``past`` (a decoder's empty cache where None)."""
        types = {i.name: _NP_INT.get(i.type, np.int64) for i in self.session.get_inputs()}
        arrays = {name: t.numpy().astype(types.get(name, np.int64)) for name, t in tensors.items()}
        if past is None:
            past = self.empty_cache(next(iter(tensors.values())).shape[0])
        return {**arrays, **past}

    def fed(self, batch: Batch) -> dict[str, np.ndarray]:
        """What :meth:`ort` feeds for ``batch``."""
        return self.feed(batch.inputs(self.inputs.roles))

    def step(self, feed: dict[str, torch.Tensor], past: dict[str, np.ndarray]
             ) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
        """One onnxruntime run of ``feed`` (tensors by input name) after the cache ``past`` (arrays by
        cache input name): the outputs, float64 by name, and the cache the graph returns, by the
        input name it is fed back as."""
        names = list(self.inputs.outputs) + [pair.present for pair in self.inputs.cache]
        try:
            out = self.session.run(names, self.feed(feed, past))
        except Exception as exc:
            raise ModelRaised(f"onnxruntime raised {type(exc).__name__}: {error_line(exc)}") from None
        n = len(self.inputs.outputs)
        outputs = {name: torch.from_numpy(np.asarray(v)).double() for name, v in zip(names[:n], out[:n], strict=True)}
        return outputs, {pair.past: np.asarray(v) for pair, v in zip(self.inputs.cache, out[n:], strict=True)}

    def empty_cache(self, b: int) -> dict[str, np.ndarray]:
        """A decoder's cache before its first token: each input (B, heads, 0, head_dim); TargetError
        where neither the graph nor the eager model's config states a size."""
        cache: dict[str, np.ndarray] = {}
        for pair in self.inputs.cache:
            heads, head_dim = pair.heads or self.eager.cache_dims[0], pair.head_dim or self.eager.cache_dims[1]
            if heads is None or head_dim is None:
                raise TargetError(f"{pair.past} leaves its heads or head dim symbolic and the eager model's config "
                                  "states neither (num_key_value_heads, head_dim): an empty cache cannot be shaped")
            cache[pair.past] = np.zeros((b, heads, 0, head_dim), dtype=helper.tensor_dtype_to_np_dtype(pair.dtype))
        return cache

    def eager_run(self, batch: Batch, *, exact: bool) -> dict[str, torch.Tensor]:
        roles = {role: getattr(batch, role) for role in self.inputs.roles}
        try:
            return self.eager.run(roles, self.inputs.outputs, exact=exact)
        except Exception as exc:
            precision = "float64" if exact else str(self.eager.dtype).removeprefix("torch.")
            raise ModelRaised(f"the eager model ({precision}) raised {type(exc).__name__}: "
                              f"{error_line(exc)}") from None

    def read_claims(self, seed: int = 0) -> None:
        """Which padding sides the eager model keeps real tokens' outputs on, in float64, on a probe
        batch of items with 3, 5 and 8 real tokens of 9."""
        self.keeps = {"right": ""}
        for side in ("left", "holes"):
            probe = make_batch([3, 5, 8], 9, side, self.eager.vocab_size, self.eager.type_vocab_size, seed)
            padded = self.eager_run(probe, exact=True)
            worst = 0.0
            for i in range(3):
                alone = self.eager_run(probe.item(i, unpadded=True), exact=True)
                for name, value in self.sequence_outputs(padded).items():
                    keep = probe.attention_mask[i].bool()
                    worst = max(worst, largest(value[i][keep] - alone[name][0]))
            self.keeps[side] = "" if worst <= 1e-9 else (
                f"the eager model itself changes real tokens' outputs by up to {worst:.3g} under {side} padding "
                "(its positions count the padding, as absolute position embeddings do): it claims right padding "
                "only")

    def sequence_outputs(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The outputs with a position axis, (B, L, ...) (read from the graph: a pooled (B, D) output
        whose D equals L is not one)."""
        return {k: v for k, v in outputs.items() if k in self.inputs.sequence}

    def real(self, name: str, value: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Where output ``name`` is a real token's: (B, L, ...) at real positions; a pooled (B, ...) of
        items whose first token is real (HF's poolers read token 0, a pad under left padding); a bool
        tensor of ``value``'s shape."""
        mask = batch.attention_mask.bool()
        where = mask if name in self.inputs.sequence else mask[:, 0]
        return where.reshape(*where.shape, *(1,) * (value.dim() - where.dim())).expand_as(value)


def largest(t: torch.Tensor) -> float:
    """max of |t|, 0 for an empty selection (a pooled output of an item whose first token is a pad)."""
    return float(t.abs().max()) if t.numel() else 0.0


def nearest(held: tuple[float, float], error: float, allowed: float) -> tuple[float, float]:
    """Of two (error, allowed) pairs, the one nearest its allowance: a check's worst is shown with the
    allowance of the comparison it came from, never the largest error beside the smallest allowance."""
    def ratio(e: float, a: float) -> float:
        return e / a if a > 0 else (0.0 if e == 0 else math.inf)

    return (error, allowed) if not math.isfinite(held[1]) or ratio(error, allowed) > ratio(*held) else held


def allowed_between(oracle: torch.Tensor, same: torch.Tensor, dtype: torch.dtype) -> float:
    """The allowance between two onnxruntime runs of the same positions: the eager model's error in
    ``dtype`` (``same`` - ``oracle``) on both sides."""
    return _allowed(oracle, same, dtype, largest(same - oracle))


def _allowed(oracle: torch.Tensor, same: torch.Tensor, dtype: torch.dtype, extra: float = 0.0) -> float:
    ref = float((same - oracle).abs().max()) if oracle.numel() else 0.0
    scale = float(oracle.abs().max()) if oracle.numel() else 0.0
    return tolerance_for(dtype).allowed(ref + extra, scale)


def outputs_agree(mut: ModelUnderTest, batch: Batch) -> Measure:
    got, exact, same = mut.ort(batch), mut.eager_run(batch, exact=True), mut.eager_run(batch, exact=False)
    worst, allowed, padded_note = 0.0, math.inf, None
    outside = mut.outside(batch)
    for name in mut.inputs.outputs:
        real = mut.real(name, exact[name], batch)
        if bool(real.any()):
            comparison = compare(got[name][real], exact[name][real], same[name][real], mut.eager.dtype)
            if not math.isfinite(comparison.allowed):
                return UNCHECKED
            if not comparison.ok and outside:
                return Measure(checked=False,  # outside the precondition: measured and said, not counted
                               finding=("precondition", f"{outside}; under {batch.padding} padding "
                                                        f"{name} at real tokens differs from the eager model's: "
                                                        f"{comparison}"))
            if not comparison.ok:
                raise ModelViolation(f"{name} at real tokens, onnxruntime vs the eager model in float64: "
                                     f"{comparison}", comparison.error, comparison.allowed,
                                     replay=replay_of(mut.fed(batch), name, exact[name], real, comparison.allowed))
            worst, allowed = nearest((worst, allowed), comparison.error, comparison.allowed)
        for where, pad in _padding(mut, name, exact[name], batch).items():
            if not bool(pad.any()) or padded_note is not None:
                continue
            off = compare(got[name][pad], exact[name][pad], same[name][pad], mut.eager.dtype)
            if off.ok:
                continue
            if outside:  # the graph was fed what its fused attention documents it does not take
                return Measure(checked=False, finding=("precondition", f"{outside}; under {batch.padding} padding "
                                                                       f"{name} at {where} differs from the eager "
                                                                       f"model's: {off}"))
            if not mut.eager.padding_unspecified:  # the eager model's own library declares nothing: held
                raise ModelViolation(f"{name} at {where}, onnxruntime vs the eager model in float64: {off}",
                                     off.error, off.allowed,
                                     replay=replay_of(mut.fed(batch), name, exact[name], pad, off.allowed))
            padded_note = (f"{name} differs from the eager model at {where}, {off}; "
                           f"{mut.eager.padding_unspecified}, so it is no failure")
    if not math.isfinite(allowed):
        return UNCHECKED
    return Measure(worst, allowed, finding=None if padded_note is None else ("unspecified", padded_note))


def _padding(mut: ModelUnderTest, name: str, value: torch.Tensor, batch: Batch) -> dict[str, torch.Tensor]:
    """Where output ``name`` is not a real token's, in two places: padded positions (and pooled outputs
    read at a pad) of items with real tokens, and whole fully padded items; bool tensors of
    ``value``'s shape."""
    real = mut.real(name, value, batch)
    empty = (batch.attention_mask.sum(dim=1) == 0).reshape(-1, *(1,) * (value.dim() - 1)).expand_as(value)
    return {"padded positions of items with real tokens": ~real & ~empty, "fully padded items": empty}


def padding_invariance(mut: ModelUnderTest, batch: Batch) -> Measure:
    if mut.claims(batch.padding):
        return UNCHECKED  # a side the eager model or the graph does not keep (said once, in the result)
    padded, padded_exact, padded_same = mut.ort(batch), mut.eager_run(batch, exact=True), \
        mut.eager_run(batch, exact=False)
    worst, allowed, checked = 0.0, math.inf, False
    for i, n in enumerate(batch.real):
        if n == 0 or n == batch.input_ids.shape[1]:
            continue  # nothing padded, or nothing real
        alone_batch = batch.item(i, unpadded=True)
        alone, alone_exact, alone_same = mut.ort(alone_batch), mut.eager_run(alone_batch, exact=True), \
            mut.eager_run(alone_batch, exact=False)
        keep = batch.attention_mask[i].bool()
        for name, value in mut.sequence_outputs(padded).items():
            error = largest(value[i][keep] - alone[name][0])
            extra = largest(alone_same[name] - alone_exact[name])
            limit = _allowed(padded_exact[name][i][keep], padded_same[name][i][keep], mut.eager.dtype, extra)
            if not math.isfinite(limit):
                continue  # the oracle is not finite here: nothing is compared, nothing passes
            if not error <= limit:
                expected, where = placed(value, (i, keep), alone[name][0])
                raise ModelViolation(f"{name} of item {i} ({n} real tokens, {batch.padding} padding to "
                                     f"{batch.input_ids.shape[1]}) vs the item unpadded: max difference {error:.3g} > "
                                     f"allowed {limit:.3g}", error, limit,
                                     replay=replay_of(mut.fed(batch), name, expected, where, limit))
            (worst, allowed), checked = nearest((worst, allowed), error, limit), True
    return Measure(worst, allowed) if checked else UNCHECKED


def batch_independence(mut: ModelUnderTest, batch: Batch) -> Measure:
    if batch.input_ids.shape[0] < 2:
        return UNCHECKED
    together, exact, same = mut.ort(batch), mut.eager_run(batch, exact=True), mut.eager_run(batch, exact=False)
    worst, allowed, checked = 0.0, math.inf, False
    for i, n in enumerate(batch.real):
        if n == 0:
            continue
        alone = mut.ort(batch.item(i))
        for name, value in together.items():
            real = mut.real(name, value, batch)[i]
            if not bool(real.any()):
                continue  # a pooled output read at a pad
            error = largest(value[i][real] - alone[name][0][real])
            limit = allowed_between(exact[name][i][real], same[name][i][real], mut.eager.dtype)
            if not math.isfinite(limit):
                continue  # the oracle is not finite here: nothing is compared, nothing passes
            if not error <= limit:
                expected, where = placed(value, (i, real), alone[name][0][real])
                raise ModelViolation(f"{name} of item {i} computed alone vs in a batch of "
                                     f"{batch.input_ids.shape[0]}: max difference {error:.3g} > allowed {limit:.3g}",
                                     error, limit, replay=replay_of(mut.fed(batch), name, expected, where, limit))
            (worst, allowed), checked = nearest((worst, allowed), error, limit), True
    return Measure(worst, allowed) if checked else UNCHECKED


def fully_padded_finite(mut: ModelUnderTest, batch: Batch) -> Measure:
    empty = [i for i, n in enumerate(batch.real) if n == 0]
    if not empty:
        return UNCHECKED
    got = mut.ort(batch)
    for name, value in got.items():
        bad = [i for i in empty if not bool(torch.isfinite(value[i]).all())]
        if bad:
            eager = mut.eager_run(batch, exact=False)[name]
            inherited = all(not bool(torch.isfinite(eager[i]).all()) for i in bad)
            if inherited:
                return Measure(finding=("inherited", f"{name} of fully padded item {bad[0]} is not finite in "
                                                     "onnxruntime, as in the eager model it was exported from"))
            expected, where = placed(value, (bad[0],), eager[bad[0]])
            raise ModelViolation(f"{name} of fully padded item {bad[0]} is not finite in onnxruntime (the eager "
                                 "model's is finite)", replay=replay_of(mut.fed(batch), name, expected, where, 0.0))
    return Measure()


#: name -> check, in the order they run
CHECKS: dict[str, Callable[[ModelUnderTest, Batch], Measure]] = {
    "outputs_agree": outputs_agree,
    "padding_invariance": padding_invariance,
    "batch_independence": batch_independence,
    "fully_padded_finite": fully_padded_finite,
}
