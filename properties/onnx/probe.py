"""What a model's mask input means, asked of the model itself: a few seeded calls in each mask kind,
held against the float64 oracle, before any property runs.

The file cannot say which way a bool mask points (ONNX's keep, True = may attend, or torch
MHA's drop, True = masked out) when its name does not, and no file says what a fully masked
row gives. :func:`probe_mask` tells which kinds reproduce the oracle on rows that keep some
keys, and which (kind, fully_masked) pairs reproduce it on fully masked rows. ``validate``
uses the first to refuse a reading the model contradicts (a usage error where the kind was
a default, a failure where it was declared), the second only as a hint: a fully masked row
that differs from the contract is a finding of ``fully_masked_rows``, not a question.

The comparison is coarse on purpose (5 % of the output's magnitude): it tells kinds apart,
whose outputs differ by O(1); precision is the properties' job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from mha_verify.mha.masks import FULLY_MASKED
from mha_verify.mha.reference import multi_head
from mha_verify.properties.onnx.ort_target import OrtInstance
from mha_verify.properties.onnx.reading import BOOL_KINDS, FLOAT_KINDS

RTOL = 0.05
PROBES = 4


@dataclass(frozen=True)
class MaskProbe:
    """read: the kind read or declared; matches: the kinds that reproduce the oracle on rows
    keeping some keys (all probes); fully_masked: "kind/fully_masked" pairs that reproduce it on
    fully masked rows; calls: probe calls that ran."""

    read: str
    matches: tuple[str, ...]
    fully_masked: tuple[str, ...]
    calls: int

    @property
    def contradicted(self) -> bool:
        """The model computes another kind than read, and not the read one."""
        return bool(self.matches) and self.read not in self.matches


def _close(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """Equal within RTOL of the output's magnitude; NaN where the reference is NaN counts as equal."""
    got = got.to(torch.float64)
    both_nan = torch.isnan(got) & torch.isnan(ref)
    diff = torch.where(both_nan, torch.zeros_like(ref), (got - ref).abs())
    scale = float(ref.nan_to_num(0.0).abs().max()) + 1e-6
    return bool(torch.isfinite(diff).all()) and float(diff.max()) <= RTOL * scale


def probe_mask(instance: OrtInstance, *, seed: int = 0) -> MaskProbe | None:
    """Call the model on :data:`PROBES` seeded examples in each mask kind; None without a mask input.

    Each example has B = 2 (or the fixed B), Lq = 3, Lk = 5 (or the fixed lengths), inputs of
    magnitude 1 or 30 in turn, a random keep
    pattern over the axes the model's mask carries with a kept key in every row, and item 0's
    last query row fully masked (for a key padding mask: item 0; for a mask over keys alone: all).
    """
    info = instance.info
    if info.mask is None or info.reading.mask_kind is None:
        return None
    fixed = info.fixed_axes
    B, Lq = fixed[0] or 2, fixed[1] or 3
    Lk = Lq if info.self_attention else (fixed[2] or 5)
    axes = info.mask_axes()
    full = tuple(a != 1 for a in axes)
    kinds = BOOL_KINDS if info.mask_types == {"bool"} else FLOAT_KINDS
    gen = torch.Generator().manual_seed(seed)
    params = instance.params()
    scoring = instance.conventions.scoring
    ok = {k: 0 for k in kinds}
    fm_ok = {f"{k}/{f}": 0 for k in kinds for f in FULLY_MASKED}
    calls = 0
    for i in range(PROBES):
        # every other example at magnitude 30: with small weights (HF initializes at std 0.02) scores of
        # unit inputs are ~1e-3, and "uniform" cannot be told from "as if unmasked" or a bias
        scale = 1.0 if i % 2 == 0 else 30.0
        q = (scale * torch.randn(B, Lq, instance.d_model, generator=gen)).to(info.dtype)
        k = q if info.self_attention else (scale * torch.randn(B, Lk, instance.d_model, generator=gen)).to(info.dtype)
        v = q if info.self_attention else (scale * torch.randn(B, Lk, instance.d_model, generator=gen)).to(info.dtype)
        shape = tuple(s if f else 1 for s, f in zip((B, instance.n_head, Lq, Lk), full, strict=True))
        keep = torch.rand(shape, generator=gen) < 0.6
        keep[..., int(torch.randint(Lk, (1,), generator=gen))] = True  # a kept key in every row
        keep.view(-1, Lk)[0] = torch.arange(Lk) == 0  # and one row keeping only key 0
        masked = keep.clone()
        if full[2]:
            masked[0, ..., -1, :] = False  # item 0's last query row (every item's, without a batch axis)
        elif full[0]:
            masked[0] = False  # a key padding mask: item 0 wholly padded
        else:
            masked[:] = False  # a mask over keys alone: every row
        for kind in kinds:
            variant = OrtInstance(dataclasses.replace(info, reading=dataclasses.replace(info.reading, mask_kind=kind)),
                                  instance.session, params)
            try:
                got = variant(q, k, v, keep)
                got_masked = variant(q, k, v, masked)
            except Exception:  # NotApplicable, or onnxruntime's refusal: a kind the model cannot run is not its kind
                continue
            ref, _ = multi_head(q, k, v, params, instance.n_head, keep, scoring=scoring)
            ok[kind] += _close(got, ref)
            for fm in FULLY_MASKED:
                ref_m, _ = multi_head(q, k, v, params, instance.n_head, masked, fully_masked=fm, scoring=scoring)
                fm_ok[f"{kind}/{fm}"] += _close(got_masked, ref_m)
            calls += 1
    matches = tuple(k for k in kinds if ok[k] == PROBES)
    return MaskProbe(info.reading.mask_kind, matches, tuple(p for p, n in fm_ok.items() if n == PROBES), calls)


def describe_probe(probe: MaskProbe, info_kind_source: str, declared: bool,
                   mask_name: str) -> tuple[str | None, str | None]:
    """(usage error, interface problem) from a probe: a usage error where the model contradicts a
    default reading (the file did not say), a problem where it contradicts a declared one."""
    if not probe.contradicted:
        return None, None
    other = " or ".join(probe.matches)
    said = (f"mask input {mask_name} read as {probe.read} ({info_kind_source}), but on {PROBES} probe examples the "
            f"model computes it as {other}")
    if declared:
        return None, f"mask kind: {said}"
    return (f"{said}; the file does not say which: pass --mask-kind {probe.matches[0]} to judge it so, or "
            f"--mask-kind {probe.read} to hold it to {probe.read}"), None
