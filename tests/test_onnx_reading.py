"""What ``validate`` reads from a model file before any guess (properties/onnx/reading.py): the
layout of q/k/v, the axes and kind of the mask input, and a usage error naming the flag where
the file does not say or contradicts itself."""

from __future__ import annotations

import pytest

from mha_verify.properties.onnx.reading import (
    Ambiguous,
    parse_conventions,
    read_layout,
    read_mask_axes,
    read_mask_kind,
)


@pytest.mark.parametrize(("q", "k", "mask", "layout"), [
    (("lq", "b", 16), ("lk", "b", 16), None, "seq-first"),  # torch MHA's default: they share B on axis 1
    (("b", "lq", 16), ("b", "lk", 16), None, "batch-first"),
    ((5, 2, 16), (7, 2, 16), None, "seq-first"),  # static: the shared size is B
    (("s0", "s1", 16), None, ("m", ("s3", 1, "s1", "s1")), "batch-first"),  # the mask's query axis is axis 1
    (("seq_len", "s1", 16), None, None, "seq-first"),  # by name alone
    (("batch_size", "s1", 16), None, None, "batch-first"),
], ids=["shared-axis-1", "shared-axis-0", "static", "mask-query-axis", "seq-name", "batch-name"])
def test_the_layout_is_read_from_the_file(q: tuple, k: tuple | None, mask: tuple | None, layout: str) -> None:
    got, source = read_layout(("q", q), None if k is None else ("k", k), mask, {}, {})
    assert got == layout, source
    assert source  # the reading says where it came from


def test_no_evidence_is_a_usage_error_naming_the_flag() -> None:
    with pytest.raises(Ambiguous, match=r"cannot tell whether query .* pass --layout batch-first"):
        read_layout(("query", ("query_dynamic_axes_1", "query_dynamic_axes_2", 16)),
                    ("key", ("key_dynamic_axes_1", "key_dynamic_axes_2", 16)), None, {}, {})


def test_a_file_that_contradicts_itself_is_a_usage_error() -> None:
    # the names say batch-first, the shared axis says seq-first
    with pytest.raises(Ambiguous, match=r"contradicts itself.*--layout"):
        read_layout(("q", ("batch", "n", 16)), ("k", ("lk", "n", 16)), None, {}, {})


@pytest.mark.parametrize(("x", "layout"), [
    (("b", "n", 16), "batch-first"),  # timm's (B, N, C): N is the length
    (("B", "N", 16), "batch-first"),
    (("batch", "n", 16), "batch-first"),
    (("l", "n", 16), "seq-first"),  # torch's (L, N, E): N is the batch
    (("seq", "N", 16), "seq-first"),
    (("t", "n", 16), "seq-first"),
    (("N", "L", 16), "batch-first"),  # torch's batch_first (N, L, E)
], ids=["timm-b-n", "timm-B-N", "batch-n", "torch-l-n", "seq-N", "t-n", "torch-N-L"])
def test_n_is_read_beside_the_other_axis_name(x: tuple, layout: str) -> None:
    got, source = read_layout(("x", x), None, None, {}, {})
    assert got == layout, source
    assert "'n'" in source.lower()  # the reading says it took N as the other axis


@pytest.mark.parametrize("x", [("x0", "N", 16), ("x0", "n", 7)], ids=["x-N", "x-n-static"])
def test_n_second_alone_is_a_usage_error_naming_the_flag(x: tuple) -> None:
    """N second is torch's batch in (L, N, E) and timm's length in (B, N, C)."""
    with pytest.raises(Ambiguous, match=r"cannot tell whether x .*torch's \(L, N, E\).*pass --layout batch-first"):
        read_layout(("x", x), None, None, {}, {})


@pytest.mark.parametrize("x", [("n", "x1", 16), ("N", 7, 16)], ids=["n-x", "N-static"])
def test_n_first_is_the_batch(x: tuple) -> None:
    """Only torch's (N, L, E) puts an N first, as its batch."""
    got, source = read_layout(("x", x), None, None, {}, {})
    assert got == "batch-first" and "comes first" in source, source


def test_n_alone_is_settled_by_a_shared_axis() -> None:
    assert read_layout(("q", ("n", "lq", 16)), ("k", ("n", "lk", 16)), None, {}, {})[0] == "batch-first"
    assert read_layout(("q", ("x0", "n", 16)), ("k", ("x1", "n", 16)), None, {}, {})[0] == "seq-first"


def test_two_batch_names_are_still_a_contradiction() -> None:
    with pytest.raises(Ambiguous, match=r"contradicts itself.*'batch' \(batch-first\), but .*'batch_size' "
                                        r"\(seq-first\)"):
        read_layout(("x", ("batch", "batch_size", 16)), None, None, {}, {})


def test_a_declaration_or_metadata_wins_and_is_checked() -> None:
    unnamed = ("q", ("a0", "a1", 16))
    assert read_layout(unnamed, None, None, {}, {"layout": "seq-first"}) == ("seq-first", "declared")
    assert read_layout(unnamed, None, None, {"layout": "seq_first"}, {}) == ("seq-first", "metadata")
    with pytest.raises(ValueError, match="metadata 'layout' must be one of batch-first, seq-first, got 'import os'"):
        read_layout(unnamed, None, None, {"layout": "import os"}, {})


@pytest.mark.parametrize(("name", "dims", "labels"), [
    ("attn_mask", ("4*b", "lq", "lk"), ("B*H", "Lq", "Lk")),  # torch's (B*H, Lq, Lk), as dynamo names it
    ("attn_mask", ("b", "lq", "lk"), ("B", "Lq", "Lk")),
    ("key_padding_mask", ("n", "lk"), ("B", "Lk")),
    ("mask", ("b", "lk"), ("B", "Lk")),  # its first axis is q's batch symbol
    ("mask", ("lq", "lk"), ("Lq", "Lk")),
    ("mask", ("b", 1, "lq", "lk"), ("B", "H", "Lq", "Lk")),
])
def test_mask_axes_are_read_from_names_and_shared_symbols(name: str, dims: tuple, labels: tuple) -> None:
    assert read_mask_axes((name, dims), "b", "lq", "lk", {}, {})[0] == labels


def test_a_mask_whose_axes_cannot_be_told_is_a_usage_error() -> None:
    with pytest.raises(Ambiguous, match="pass --mask-axes B,Lk or --mask-axes Lq,Lk"):
        read_mask_axes(("m", ("m0", "m1")), "b", "lq", "lk", {}, {})
    with pytest.raises(Ambiguous, match="--mask-axes B,Lq,Lk or --mask-axes B\\*H,Lq,Lk"):
        read_mask_axes(("m", ("m0", "lq", "lk")), "b", "lq", "lk", {}, {})
    assert read_mask_axes(("m", ("m0", "m1")), "b", "lq", "lk", {}, {"mask_axes": "B,Lk"}) == (("B", "Lk"), "declared")
    for bad in ("B,Lq", "B,H,Lk", "B*H,B,Lk", "X,Lk"):
        with pytest.raises(ValueError, match="--mask-axes"):
            read_mask_axes(("m", ("m0", "m1")), "b", "lq", "lk", {}, {"mask_axes": bad})


def test_the_mask_kind_is_read_or_declared_and_checked_against_the_type() -> None:
    assert read_mask_kind("key_padding_mask", True, {}, {})[::2] == ("drop", True)
    assert read_mask_kind("attn_mask", True, {}, {})[::2] == ("keep", False)  # ONNX's default: not declared
    assert read_mask_kind("attention_mask", False, {}, {"mask_kind": "additive_min"})[::2] == ("additive_min", True)
    with pytest.raises(ValueError, match="--mask-kind for mask input m \\(bool\\) must be one of keep, drop"):
        read_mask_kind("m", True, {}, {"mask_kind": "additive"})


def test_conventions_take_checked_keys() -> None:
    assert parse_conventions("fully_masked=uniform, causal=true") == {"fully_masked": "uniform", "causal": "true"}
    assert parse_conventions("scale=1") == {"scale": "1.0"}
    with pytest.raises(ValueError, match="KEY in fully_masked, causal, scale, rotary, rows_unspecified"):
        parse_conventions("window=2")
    for bad in ("scale=0", "scale=-1", "scale=nan", "scale=x"):
        with pytest.raises(ValueError, match="--conventions scale must be a positive number"):
            parse_conventions(bad)
    with pytest.raises(ValueError, match="fully_masked must be one of zeros, uniform, uniform_visible, nan"):
        parse_conventions("fully_masked=inf")


def test_a_rotary_and_unspecified_rows_are_declarable_and_checked() -> None:
    """A file's metadata or ``--conventions`` may state the RoPE (a cut GroupQueryAttention block does) and
    that fully masked rows are the runtime's to choose; the text is read back as numbers and flags only."""
    assert parse_conventions("rotary=500000;true;0.5;false, rows_unspecified=true") == {
        "rotary": "500000.0;true;0.5;false", "rows_unspecified": "true"}
    for bad in ("rotary=10000", "rotary=10000;yes;1;false", "rotary=1;false;1;false", "rotary=1e4;false;2;false",
                "rotary=__import__('os');false;1;false"):
        with pytest.raises(ValueError, match="--conventions rotary: rotary takes base;interleaved;fraction;reverse"):
            parse_conventions(bad)
    with pytest.raises(ValueError, match="rows_unspecified must be one of true, false"):
        parse_conventions("rows_unspecified=maybe")
