"""Sizes of attention examples: B, Lq, Lk, D and H, drawn from cases that keep every axis small or
push one axis onto a kernel's block boundary, one off it or past it; the runner can force a case.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import NamedTuple

from hypothesis import strategies as st

# Block sizes of tiled kernels and chunked loops: lengths land on them, one off, and past them.
BOUNDARIES = (16, 32, 64, 128, 256)
# The cases of :func:`sizes`: ("small", 0) keeps every axis small; the others push one axis
# onto a block boundary (16 .. 256), one off it or past it with an odd remainder, or past the
# chunk sizes of head and batch loops (4, 8) and head-width caps (64), D up to 1024.
SIZE_CASES: tuple[tuple[str, object], ...] = (
    *(("small", 0),) * 12,
    ("lk", 33), ("lk", 31), ("lk", 32), ("lk", 65), ("lk", 129), ("lk", 257), ("lk", 19),
    ("lq", 17), ("lq", 16), ("lq", 33), ("lq", 130), ("lq", 257),
    ("lqlk", 64), ("lqlk", 129),
    ("batch", 8), ("batch", 9),
    ("heads", (16, 64)), ("heads", (8, 128)), ("heads", (5, 24)), ("heads", (12, 64)), ("heads", (8, 16)),
    ("heads", (16, 8)),
)


class Sizes(NamedTuple):
    """B, Lq, Lk (== Lv), D = d_model and H = n_head, with D % H == 0."""

    batch: int
    lq: int
    lk: int
    d_model: int
    n_head: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def mask_target(self) -> tuple[int, int, int, int]:
        """(B, H, Lq, Lk), the shape every mask broadcasts to."""
        return (self.batch, self.n_head, self.lq, self.lk)

# Lk = 1 ("one") is one choice in ten, away from both ends: Hypothesis draws the first and last
# elements of a sampled_from more often than the rest (at the end it gave Lk = 1 in 13-18 % of
# the ci examples); the first, "same", is where a counterexample shrinks to.
_LK_MODES = ("same", "other", "same", "other", "one", "same", "other", "other", "same", "other")


_FORCED_CASE: ContextVar[tuple[str, object] | None] = ContextVar("mha_verify_size_case", default=None)
# The cases of properties that cost several forward passes per example: lengths up to 33,
# batches of 8, up to 8 heads of width 16 (no D = 1024, no 257-long rows).
MODEST_CASES: tuple[tuple[str, object], ...] = (
    *(("small", 0),) * 12, ("lk", 33), ("lk", 17), ("lq", 17), ("lq", 16), ("batch", 8), ("heads", (8, 16)),
    ("heads", (5, 8)),
)
_CASE_TABLE: ContextVar[tuple[tuple[str, object], ...]] = ContextVar("mha_verify_size_cases", default=SIZE_CASES)


@contextlib.contextmanager
def modest_size_cases() -> Iterator[None]:
    """Within the block, :func:`sizes` strategies built draw from :data:`MODEST_CASES`."""
    token = _CASE_TABLE.set(MODEST_CASES)
    try:
        yield
    finally:
        _CASE_TABLE.reset(token)


@contextlib.contextmanager
def forced_size_case(case: tuple[str, object]) -> Iterator[None]:
    """Within the block, :func:`sizes` strategies built draw only ``case`` (one of SIZE_CASES).

    The runner sweeps :func:`boundary_cases` this way after its random examples, so a short
    derandomized run reaches every boundary whatever Hypothesis's generator favours.
    """
    if case not in SIZE_CASES and case not in MODEST_CASES:
        raise ValueError(f"case must be one of SIZE_CASES or MODEST_CASES, got case={case!r}")
    token = _FORCED_CASE.set(case)
    try:
        yield
    finally:
        _FORCED_CASE.reset(token)


def boundary_cases() -> tuple[tuple[str, object], ...]:
    """The cases of SIZE_CASES that push an axis past a boundary (all but "small")."""
    return tuple(dict.fromkeys(c for c in SIZE_CASES if c[0] != "small"))

def _check_positive(**kwargs: int) -> None:
    for name, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")


def sizes(
    *, max_batch: int = 9, max_len: int = 300, max_heads: int = 16, max_head_dim: int = 128,
    max_d_model: int = 1024, min_batch: int = 1, min_len: int = 1, fixed: tuple[int, int] | None = None,
    axes: tuple[int | None, int | None, int | None] = (None, None, None),
) -> st.SearchStrategy[Sizes]:
    """Sizes with D = H * Hd and Lq, Lk drawn independently, reaching past real block boundaries.

    A third of the examples are small (cheap, and they shrink well); each of the others
    pushes one axis (:data:`SIZE_CASES`) past the sizes where tiled kernels and chunked loops
    change behaviour, keeping the rest small: Lq and/or Lk on a block size of
    :data:`BOUNDARIES`, one off it or with an odd remainder; up to 16 heads and head widths
    up to 128 (D up to ``max_d_model``); 8 and 9 batch items.

    Lk = 1 (softmax identically 1: q, k and the scale cannot matter) is kept rare, ~10 %.
    ``fixed=(d_model, n_head)`` pins D and H (an exported model); ``min_batch``/``min_len``
    keep examples where a property compares something (permutations need 2 positions).
    ``axes=(B, Lq, Lk)`` pins each axis given (a model exported with static axes is judged at
    its sizes), whatever the case or the minimums.
    """
    _check_positive(max_batch=max_batch, max_len=max_len, max_heads=max_heads, max_head_dim=max_head_dim,
                    max_d_model=max_d_model, min_batch=min_batch, min_len=min_len)
    if min_batch > max_batch or min_len > max_len:
        raise ValueError(f"min_batch={min_batch}, min_len={min_len} must not exceed max_batch={max_batch}, "
                         f"max_len={max_len}")
    if fixed is not None:
        d_fixed, h_fixed = fixed
        _check_positive(d_model=d_fixed, n_head=h_fixed)
        if d_fixed % h_fixed:
            raise ValueError(f"fixed d_model={d_fixed} is not divisible by n_head={h_fixed}")
    for name, size in zip(("B", "Lq", "Lk"), axes, strict=True):
        if size is not None:
            _check_positive(**{name: size})
    forced = _FORCED_CASE.get()
    cases = _CASE_TABLE.get() if forced is None else (forced,)
    drawn = _draw_sizes(cases, min_batch, max_batch, min_len, max_len, max_heads, max_head_dim, max_d_model, fixed)
    if axes == (None, None, None):
        return drawn
    return drawn.map(lambda s: s._replace(batch=axes[0] or s.batch, lq=axes[1] or s.lq, lk=axes[2] or s.lk))


# Composite strategies are decorated once, here: ``st.composite`` inspects the function's
# signature, which cost 5 ms for every strategy built inside ``sizes()`` (10 s of a ci gate).
@st.composite
def _draw_sizes(draw: st.DrawFn, cases: tuple[tuple[str, object], ...], min_batch: int, max_batch: int,
                min_len: int, max_len: int, max_heads: int, max_head_dim: int, max_d_model: int,
                fixed: tuple[int, int] | None) -> Sizes:
    small_len = min(8, max_len)

    def clamp(n: int) -> int:
        return max(min_len, min(max_len, n))

    def small(lo: int = 1) -> int:
        return draw(st.integers(max(min_len, lo), max(min_len, lo, small_len)))

    # Every choice is drawn in the same order whatever the case, and the case overrides
    # afterwards: the shrinker can then move a counterexample to the "small" case (index 0).
    axis, value = draw(st.sampled_from(cases))
    batch = draw(st.integers(min_batch, max(min_batch, min(3, max_batch))))
    lq = small(1)
    lk_mode = draw(st.sampled_from(_LK_MODES))
    lk_other = small(2)
    n_head = draw(st.integers(1, min(4, max_heads)))
    head_dim = draw(st.integers(1, min(8, max_head_dim)))
    # beside a wide or batch axis, two positions at least: with one key, softmax is 1 and keys cannot matter
    if axis in ("batch", "heads"):
        lq = clamp(max(lq, 2))
        lk_mode = "other" if lk_mode == "one" else lk_mode
    # Lk = 1 only when chosen ("one"): a single query meets several keys otherwise (decoding)
    lk = lq if lk_mode == "same" and lq > 1 else clamp(1) if lk_mode == "one" else lk_other
    if axis == "batch":
        batch = max(min_batch, min(max_batch, int(value)))  # type: ignore[call-overload]
    if axis in ("lq", "lqlk"):
        lq = clamp(int(value))  # type: ignore[call-overload]
    if axis in ("lk", "lqlk"):
        lk = clamp(int(value))  # type: ignore[call-overload]
    if fixed is not None:
        return Sizes(batch, lq, lk, fixed[0], fixed[1])
    if axis == "heads":
        assert isinstance(value, tuple)
        wide: tuple[int, int] = value
        n_head, head_dim = min(wide[0], max_heads), min(wide[1], max_head_dim)
        while n_head * head_dim > max_d_model and head_dim > 1:
            head_dim //= 2
    return Sizes(batch, lq, lk, n_head * head_dim, n_head)
