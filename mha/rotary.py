"""Rotary position embeddings (RoPE) as the oracle applies them to the heads of q and k.

Position p of a head x (..., L, Hd) is rotated pairwise by angles p * base^(-2i/r), i < r/2,
where r = :meth:`Rotary.dims` of the head width are rotated and the rest pass through. The
pairs are either the two halves (i, i + r/2): GPT-NeoX's and Llama's ``rotate_half``, the
layout of HF's ``apply_rotary_pos_emb``; or neighbours (2i, 2i + 1): the original paper's,
GPT-J's ``rotate_every_two``. Positions run 0 .. L-1 along q's and k's own length. A few
layers turn the other way (NanoChat's ``rotate_half`` returns ``cat(x2, -x1)``): ``reverse``
rotates by -p * base^(-2i/r), as valid a position code, and a different one.

Written from the formula, independent of any library's tables: a layer verified under it has
its own rotary verified (a half/interleaved mix-up, a wrong base, an offset position), not
replaced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rotary:
    """base: the theta of RoPE (10000 in most layers); interleaved: neighbours pair, not halves;
    fraction: of the head width rotated (partial rotary, GPT-NeoX's ``rotary_pct``); reverse: the
    rotation turns by minus the angle (NanoChat's)."""

    base: float = 10000.0
    interleaved: bool = False
    fraction: float = 1.0
    reverse: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.base) and self.base > 1.0):
            raise ValueError(f"rotary base must be a finite number > 1, got base={self.base!r}")
        if not (0.0 < self.fraction <= 1.0):
            raise ValueError(f"rotary fraction must be in (0, 1], got fraction={self.fraction!r}")

    def dims(self, head_dim: int) -> int:
        """How many of a head's ``head_dim`` columns are rotated (HF: int(head_dim * fraction))."""
        return int(head_dim * self.fraction)

    def head_dim_multiple(self) -> int:
        """The smallest m such that every multiple of m as a head width rotates an even number of
        columns, at least 2 (a rotation needs pairs): the head widths such a layer accepts."""
        for m in range(2, 257, 2):
            if all(self.dims(j * m) % 2 == 0 and self.dims(j * m) > 0 for j in range(1, 9)):
                return m
        raise ValueError(f"no head width rotates an even number of columns at fraction={self.fraction}")

    def text(self) -> str:
        """``base;interleaved;fraction;reverse`` (``10000.0;false;1.0;false``): how a model file's
        metadata, ``--conventions rotary=`` and an eager target's conventions state it."""
        return (f"{self.base!r};{'true' if self.interleaved else 'false'};{self.fraction!r};"
                f"{'true' if self.reverse else 'false'}")

    @classmethod
    def parse(cls, text: str) -> Rotary:
        """:meth:`text` read back; ValueError naming the text for anything else (it may come from a
        file: it is checked, never evaluated)."""
        parts = text.split(";")
        flags = ("true", "false")
        try:
            base, interleaved, fraction, reverse = parts
            if interleaved not in flags or reverse not in flags:
                raise ValueError
            return cls(float(base), interleaved == "true", float(fraction), reverse == "true")
        except ValueError:
            raise ValueError(f"rotary takes base;interleaved;fraction;reverse (10000.0;false;1.0;false), with "
                             f"interleaved and reverse true or false, a base > 1 and a fraction in (0, 1]; "
                             f"got {text[:80]!r}") from None

    def describe(self) -> str:
        layout = "interleaved pairs" if self.interleaved else "halves"
        part = "" if self.fraction == 1.0 else f", {self.fraction:g} of each head"
        turn = ", turning the other way" if self.reverse else ""
        return f"rotary base {self.base:g}, {layout}{part}{turn}"

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., L, Hd) rotated by position along its L axis, in x's dtype.

        The angles are computed in float64 for a float64 x (the oracle), else in float32, as
        layers compute them whatever their dtype (HF's rotary embeddings): the same-precision
        reference then carries the rounding of angles of up to L radians that they carry.
        """
        length, head_dim = x.shape[-2], x.shape[-1]
        r = self.dims(head_dim)
        if r % 2 or r == 0:
            raise ValueError(f"rotary of fraction {self.fraction} rotates {r} of head width {head_dim}: "
                             "an even number > 0 is needed")
        exact = torch.float64 if x.dtype == torch.float64 else torch.float32
        inv_freq = (1.0 / self.base ** (torch.arange(0, r, 2, dtype=torch.float64) / r)).to(exact)  # (r/2,)
        angles = torch.arange(length, dtype=exact)[:, None] * inv_freq  # (L, r/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        if self.reverse:  # sin(-a) = -sin(a): the same rounding as the layer's negated rotate_half
            sin = -sin
        rot, rest = x[..., :r], x[..., r:]
        if self.interleaved:
            a, b = rot[..., 0::2], rot[..., 1::2]  # (..., L, r/2) each
            out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        else:
            a, b = rot[..., : r // 2], rot[..., r // 2:]
            out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        return torch.cat((out, rest), dim=-1)
