"""What a layer of an unknown library does with its mask, read from its source text
(``properties.adapters.mask_reading``): polarity, shape, what a fully masked row gives, a switch."""

from __future__ import annotations

import pytest

from mha_verify.properties.adapters.mask_reading import MaskReading, read_mask


def _read(source: str, name: str = "mask") -> MaskReading:
    return read_mask((("its forward", source),), name)


@pytest.mark.parametrize(("line", "kind"), [
    ("sim = sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)", "keep"),
    ("scores = scores.masked_fill(mask == 0, -1e9)", "keep"),
    ("attn = attn.masked_fill(attn_mask, float('-inf'))", "drop"),
    ("qk = qk + mask[:n_ctx, :n_ctx]", "additive"),
    ("scores += attention_mask", "additive"),
])
def test_the_polarity_is_read_from_the_line_that_applies_the_mask(line: str, kind: str) -> None:
    assert _read(line).kind == kind


def test_key_padding_and_its_fill_are_read() -> None:
    reading = _read("mask = repeat(mask, 'b j -> (b h) () j', h=h)\n"
                    "sim.masked_fill_(~mask, -torch.finfo(sim.dtype).max)")
    assert (reading.kind, reading.layout, reading.takes, reading.fully_masked) == ("keep", "BL", frozenset({"bool"}),
                                                                                     "uniform")
    assert _read("sim = sim.masked_fill(~mask[:, None, None, :], float('-inf'))").fully_masked == "nan"


def test_a_tiled_softmax_that_zeroes_masked_weights_gives_zeros_on_a_fully_masked_row() -> None:
    source = ("mask = rearrange(mask, 'b n -> b 1 1 n')\nw.masked_fill_(~col_mask, max_neg_value)\n"
              "exp_weights = torch.exp(w)\nexp_weights.masked_fill_(~col_mask, 0.)")
    assert _read(source).fully_masked == "zeros"
    # weights zeroed after a softmax on another path (perceiver's inverted attention) say nothing of this one
    other = ("sim.masked_fill_(~mask, -torch.finfo(sim.dtype).max)\nif inverted:\n"
             "    attn = attn.masked_fill(~mask, 0.)\nelse:\n    attn = sim.softmax(dim=-1)")
    assert _read(other).fully_masked == "uniform"


def test_a_causal_mask_built_under_the_same_name_is_not_the_polarity() -> None:
    source = ("sim = sim.masked_fill(~mask, v)\nif causal:\n    mask = torch.ones(i, j, dtype=torch.bool).triu(1)\n"
              "    sim = sim.masked_fill(mask, v)")
    assert _read(source).kind == "keep"


def test_a_mask_read_only_as_a_switch_is_a_switch() -> None:
    reading = _read("a = scaled_dot_product_attention(q, k, v, is_causal=mask is not None and n_ctx > 1)")
    assert reading.switch is not None and "is_causal=mask is not None" in reading.switch


def test_fairseqs_shared_mask_is_one_mask_for_every_item() -> None:
    reading = _read("attn_mask = attn_mask.unsqueeze(0)\nattn_weights += attn_mask", "attn_mask")
    assert (reading.kind, reading.layout, reading.fully_masked) == ("additive", "LL", "nan")


def test_a_source_that_says_nothing_leaves_sdpas_convention() -> None:
    reading = _read("out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)", "attn_mask")
    assert reading.kind is None and reading.layout is None and not reading.how


def test_a_row_maximum_subtracted_for_stability_is_no_guard_but_one_compared_is() -> None:
    """memory-efficient-attention's chunks subtract ``weight.amax(...)`` and fill with -finfo.max: a fully
    masked row gives uniform weights (it was read as guarded, so as zeros: six false FAILs)."""
    fill = "weight = weight.masked_fill(~mask, -torch.finfo(weight.dtype).max)\n"
    stable = fill + "weight_max = weight.amax(dim = -1, keepdim = True).detach()\nweight = weight - weight_max"
    assert _read(stable).fully_masked == "uniform"
    guarded = fill + "has_key = weight.amax(dim=-1, keepdim=True) > float('-inf')"
    assert _read(guarded).fully_masked is None


def test_batch_last_masks_and_zero_tests_are_read() -> None:
    """labml: ``mask.shape[2] == 1 or mask.shape[2] == query_shape[1]`` (batch last) and
    ``masked_fill(mask == 0, ...)``, which reads a float mask as 0/1: bool only."""
    reading = _read("assert mask.shape[2] == 1 or mask.shape[2] == query_shape[1]\n"
                    "scores = scores.masked_fill(mask == 0, float('-inf'))")
    assert (reading.kind, reading.layout, reading.takes) == ("keep", "LLB", frozenset({"bool"}))


def test_a_guard_before_the_mask_is_applied_guards_nothing() -> None:
    """torchscale's MultiheadAttention cleans the raw scores (``nan_to_num``) and then adds its -inf mask:
    a fully masked row is NaN (it was read as guarded, so held to zeros: 14 false FAILs with a 6-line
    factory). A ``nan_to_num`` after the mask still guards."""
    before = ("attn_weights = torch.bmm(q, k.transpose(1, 2))\nattn_weights = torch.nan_to_num(attn_weights)\n"
              "attn_mask = attn_mask.unsqueeze(0)\nattn_weights += attn_mask\n"
              "attn_weights = F.softmax(attn_weights, dim=-1)")
    assert _read(before, "attn_mask").fully_masked == "nan"
    after = ("attn_weights += attn_mask\nattn_weights = F.softmax(attn_weights, dim=-1)\n"
             "attn_weights = torch.nan_to_num(attn_weights)")
    assert _read(after, "attn_mask").fully_masked is None
