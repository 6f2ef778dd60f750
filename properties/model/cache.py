"""A decoder's KV-cache relation: prefill then decode gives what the full forward gives.

The batch's tokens are fed in steps (a prefill of ``P`` tokens, up to three single-token decodes,
then the rest as one chunk), each step given the cache the step before returned and the attention
mask of every position so far, as onnxruntime-genai and Optimum's ``with-past`` models are driven.
Every real token's outputs at each step must equal the full forward's at that position (one run,
empty cache), within the eager model's own error (in the graph's precision) on both sides; each
returned cache must hold every position fed so far. A graph that reads its mask as lengths (right
padding only) is held to the relation under right padding, and what it does under left padding or
holes is a finding of kind "outside a documented precondition"; one that reads the cache's length
from the mask (``GroupQueryAttention``'s ``seqlens_k``) is extended by real tokens only, as
generation does. """

from __future__ import annotations

import math

from mha_verify.properties.engine.measure import UNCHECKED, Measure, Violation
from mha_verify.properties.model.batches import Batch
from mha_verify.properties.model.checks import ModelUnderTest, allowed_between, largest, nearest
from mha_verify.properties.model.replay import ModelViolation, replay_of

#: single-token decodes after the prefill, before the rest goes as one chunk
DECODES = 3


def spans(width: int, seed: int, *, least: int = 1, chunk: bool = True) -> list[tuple[int, int]]:
    """The steps [start, end) a sequence of ``width`` tokens is fed in: a prefill of ``least``..width-1
    tokens (chosen by ``seed``), single tokens, then one chunk of the rest (a multi-token step after
    a cache, where a causal mask aligned top-left shows); single tokens to the end without ``chunk``."""
    if not 1 <= least < width:
        raise ValueError(f"a prefill of at least {least} and a decode need 1 <= least < width, got width={width}")
    start = least + seed % (width - least)
    steps = [(0, start)]
    while start < width and (len(steps) <= DECODES or not chunk):
        steps.append((start, start + 1))
        start += 1
    if start < width:
        steps.append((start, width))
    return steps


def why_not(mut: ModelUnderTest) -> str:
    """Why the relation does not apply to ``mut`` ("" where it does)."""
    return "" if mut.inputs.cache else "the graph takes no past key/values (no KV cache to decode with)"


def cache_consistency(mut: ModelUnderTest, batch: Batch) -> Measure:
    width = batch.input_ids.shape[1]
    if not mut.inputs.cache or width < 2 or not any(batch.real):
        return UNCHECKED
    full = mut.ort(batch)
    exact, same = mut.eager_run(batch, exact=True), mut.eager_run(batch, exact=False)
    outside = mut.outside(batch)
    least = 1
    if mut.needs_tokens:  # a length-read cache (GroupQueryAttention) is extended by real tokens only, as a
        pads = (batch.attention_mask == 0).nonzero()  # generation schedule extends it: pads in the prefill
        least = max(1, int(pads[:, 1].max()) + 1 if len(pads) else 1)
        if least >= width:
            return UNCHECKED
    past = mut.empty_cache(batch.input_ids.shape[0])
    worst, allowed, checked = 0.0, float("inf"), False
    # onnxruntime's GroupQueryAttention refuses a multi-token step after a cache in a batch of more than
    # one item (its own error): there the rest is decoded a token at a time, as generation does
    chunk = not (mut.needs_tokens and batch.input_ids.shape[0] > 1)
    for start, end in spans(width, batch.seed, least=least, chunk=chunk):
        feed = {name: getattr(batch, role)[:, :end] if role == "attention_mask" else getattr(batch, role)[:, start:end]
                for role, name in mut.inputs.roles.items()}
        fed = mut.feed(feed, past)
        outputs, past = mut.step(feed, past)
        for pair in mut.inputs.cache:
            held = past[pair.past].shape
            if len(held) != 4 or held[2] != end:
                raise Violation(f"{pair.present} returned after tokens {start}..{end - 1} has shape {tuple(held)}: it "
                                f"holds {held[2] if len(held) == 4 else '?'} positions where {end} were fed")
        keep = batch.attention_mask[:, start:end].bool()
        for name, value in mut.sequence_outputs(outputs).items():
            real = keep.reshape(*keep.shape, *(1,) * (value.dim() - 2)).expand_as(value)
            if not bool(real.any()):
                continue
            window = (slice(None), slice(start, end))
            oracle, ref = exact[name][window][real], same[name][window][real]
            error = largest(value[real] - full[name][window][real])
            limit = allowed_between(oracle, ref, mut.eager.dtype)
            if not math.isfinite(limit):
                continue  # the oracle is not finite here: nothing is compared, nothing passes
            if not error <= limit:
                what = (f"{name} at tokens {start}..{end - 1} fed after a cache of {start} "
                        f"position{'s' if start != 1 else ''} vs the full forward (one run, empty cache): max "
                        f"difference {error:.3g} > allowed {limit:.3g}")
                if outside:
                    return Measure(checked=False, finding=("precondition", f"{outside}; under "
                                                                           f"{batch.padding} padding {what}"))
                raise ModelViolation(what, error, limit, replay=replay_of(
                    fed, name, full[name][window], real, limit))
            (worst, allowed), checked = nearest((worst, allowed), error, limit), True
    return Measure(worst, allowed) if checked else UNCHECKED

