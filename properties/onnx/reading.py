"""What an attention model's inputs mean, read from what the file says, before any guess:
the layout of q/k/v (batch-first or seq-first), the axes of the mask input and its kind.

Each reading comes with its source, in this order: a declaration (``validate --layout``,
``--mask-axes``, ``--mask-kind``), the file's metadata (``layout``, ``mask_axes``,
``mask_kind``), mha-verify's own export metadata, then the evidence of the dimensions: the
symbols the inputs share (q and k share B, not their lengths; a mask's last axes are Lq and
Lk), the names of the symbols (``batch``, ``seq_len``; an ``n``, torch's batch but timm's length,
by the name beside it) and of the inputs (``key_padding_mask``). Evidence that contradicts
itself, or none at all, is an :class:`Ambiguous` reading: a usage error naming the flag that
tells it. Nothing here guesses.

Values read from the file are checked against fixed vocabularies; nothing read becomes code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mha_verify.mha.rotary import Rotary

LAYOUTS = ("batch-first", "seq-first")
#: the mask axis labels: a mask input's axes name a subset of (B, H, Lq, Lk), or "B*H" for
#: torch's (B·H, Lq, Lk) attn_mask (item b, head h at index b·H + h)
MASK_AXES = ("B", "H", "Lq", "Lk", "B*H")
BOOL_KINDS = ("keep", "drop")  # True = may attend (ONNX Attention, SDPA) / True = masked out (torch MHA)
FLOAT_KINDS = ("additive", "additive_min")  # -inf removes (ONNX, SDPA) / finfo.min removes (HF)
DECLARABLE = ("layout", "mask_axes", "mask_kind")
#: conventions ``validate --conventions`` declares (the file's metadata may state them too);
#: ``scale`` takes a positive number, ``rotary`` ``base;interleaved;fraction;reverse`` (a cut
#: GroupQueryAttention block states the RoPE its cos/sin caches hold), the others one of their values;
#: ``rows_unspecified=true``: what a fully masked row gives is the runtime's to choose (finite), so
#: another value than ``fully_masked`` is a finding of that kind, not a failure
CONVENTIONS: dict[str, tuple[str, ...]] = {"fully_masked": ("zeros", "uniform", "uniform_visible", "nan"),
                                           "causal": ("true", "false", "bottom_right"), "scale": (), "rotary": (),
                                           "rows_unspecified": ("true", "false")}

Dim = int | str | None
#: the metadata keys every mha-verify export writes: its q, k, v are batch-first
_EXPORT_METADATA = frozenset({"exporter", "opset", "dtype"})

_BATCH_NAME = re.compile(r"^(b|bs|bsz|nb|batch|batches|batch_?size|n_?batch|num_?batch\w*|\w*_batch)$", re.I)
_SEQ_NAME = re.compile(r"^(l|s|t|lq|lk|lv|len|seq|seqlen|seq_?len\w*|\w*_seq_?len\w*|sequence\w*|\w*length\w*|"
                       r"src_?len|tgt_?len|q_?len|kv?_?len|tokens?|num_tokens|time|steps?|positions?)$", re.I)
#: names that are the batch in one naming and the length in another: N is the batch in torch's
#: (L, N, E) and (N, L, E), the sequence in timm's (B, N, C); only the other axis's name tells which
_EITHER_NAME = re.compile(r"^n$", re.I)
_BH_NAME = re.compile(r"(\*|^bh$|^b_?h$|^batch_?heads?$|^batch_?x_?heads?$)", re.I)


class Ambiguous(ValueError):  # noqa: N818 -- a reading, raised as a usage error
    """The file does not say (or contradicts itself on) what an input means: the message names
    what cannot be told and the flag that tells it."""


@dataclass(frozen=True)
class Reading:
    """What the inputs mean, each with where it was read.

    layout: "batch-first" (q (B, Lq, D)) or "seq-first" (q (Lq, B, D), torch MHA's default).
    mask_axes: the label of each axis of the mask input (:data:`MASK_AXES`); () without one.
    mask_kind: "keep"/"drop" for a bool mask, "additive"/"additive_min" for a float one; None
        without a mask.
    declared_kind: the kind was declared or read from the file (True), not the convention's
        default (False): a probe that finds the model computing another kind is then a
        failure of the model, not a question for the user.
    """

    layout: str
    layout_source: str
    mask_axes: tuple[str, ...] = ()
    mask_axes_source: str = ""
    mask_kind: str | None = None
    mask_kind_source: str = ""
    declared_kind: bool = False

    def describe(self) -> list[str]:
        lines = [f"  layout {self.layout} ({self.layout_source})"]
        if self.mask_axes:
            lines.append(f"  mask axes ({', '.join(self.mask_axes)}) ({self.mask_axes_source}); kind {self.mask_kind} "
                         f"({self.mask_kind_source})")
        return lines


def _same(a: Dim, b: Dim) -> bool:
    """The same axis, as far as the file tells: one symbol, or one fixed size above 1."""
    return a is not None and a == b and not (isinstance(a, int) and a <= 1)


def _distinct(a: Dim, b: Dim) -> bool:
    """Two known dims the file keeps apart: different symbols or sizes."""
    return a is not None and b is not None and a != b


def _show(dims: Sequence[Dim]) -> str:
    return "(" + ", ".join("?" if d is None else repr(d) for d in dims) + ")"


def read_layout(first: tuple[str, Sequence[Dim]], key: tuple[str, Sequence[Dim]] | None,
                mask: tuple[str, Sequence[Dim]] | None, metadata: Mapping[str, str],
                declared: Mapping[str, str]) -> tuple[str, str]:
    """(layout, source) of q/x ``first`` (name, dims), with k's and the mask's dims as evidence.

    A declaration wins over the axis names, which only suggest; one that contradicts what the
    file states (its metadata) or what its shared axes prove is a ValueError naming both: every
    property judged under it would fail for the reading, not for the model.
    """
    name, dims = first
    if "layout" in declared:
        layout = _checked(declared["layout"], LAYOUTS, "--layout")
        stated = _stated_layout(first, key, mask, metadata)
        if stated is not None and stated[0] != layout:
            raise ValueError(f"--layout {layout} contradicts the model: {name} {_show(dims)} is {stated[0]} "
                             f"({stated[1]}): pass --layout {stated[0]} or leave it out")
        return layout, "declared"
    if "layout" in metadata:
        return _checked(metadata["layout"].replace("_", "-"), LAYOUTS, "the model's metadata 'layout'"), "metadata"
    if metadata.keys() >= _EXPORT_METADATA:
        return "batch-first", "mha-verify's export metadata"
    votes = _shared_axis_votes(first, key, mask)
    for layout, why in _axis_name_votes(name, dims).items():
        votes[layout] += why
    found = [layout for layout, why in votes.items() if why]
    if len(found) == 1:
        return found[0], "; ".join(votes[found[0]])
    flag = "pass --layout batch-first ((B, L, D)) or --layout seq-first ((L, B, D))"
    if found:
        raise Ambiguous(f"the file contradicts itself on the layout of {name} {_show(dims)}: "
                        f"{'; '.join(votes['batch-first'])} (batch-first), but {'; '.join(votes['seq-first'])} "
                        f"(seq-first): {flag}")
    either = [d for d in dims[:2] if isinstance(d, str) and _EITHER_NAME.match(d)]
    hint = (f" ({either[0]!r} is the batch in torch's (L, N, E) but the length in timm's (B, N, C), and no other "
            f"axis's name says which)" if either else "")
    raise Ambiguous(f"cannot tell whether {name} {_show(dims)} is (B, L, D) or (L, B, D): no axis name or shared "
                    f"axis says which{hint}: {flag}")


def _axis_name_votes(name: str, dims: Sequence[Dim]) -> dict[str, list[str]]:
    """{layout: why} from the names of q's axes 0 and 1, read together: a name that is the batch
    in one naming and the length in another (:data:`_EITHER_NAME`) is the axis the name beside it
    is not, and alone says nothing."""
    votes: dict[str, list[str]] = {"batch-first": [], "seq-first": []}
    for axis in (0, 1):
        d, beside = dims[axis], dims[1 - axis]
        if not isinstance(d, str):
            continue
        batch, seq = bool(_BATCH_NAME.match(d)), bool(_SEQ_NAME.match(d))
        why = f"{name}'s axis {axis} is named {d!r}"
        if _EITHER_NAME.match(d):
            beside_batch = isinstance(beside, str) and bool(_BATCH_NAME.match(beside))
            beside_seq = isinstance(beside, str) and bool(_SEQ_NAME.match(beside))
            if beside_batch != beside_seq:  # a name beside it that says both (or neither) settles nothing
                batch, seq = beside_seq, beside_batch
                why += f", the {'batch' if batch else 'length'} beside {beside!r}"
            elif axis == 0:  # only torch's (N, L, E) puts an N first, and there it is the batch
                batch = True
                why += ", the batch where it comes first (torch's (N, L, E); timm's N is second)"
        if batch:
            votes["batch-first" if axis == 0 else "seq-first"].append(why)
        if seq:
            votes["seq-first" if axis == 0 else "batch-first"].append(why)
    return votes


def _stated_layout(first: tuple[str, Sequence[Dim]], key: tuple[str, Sequence[Dim]] | None,
                   mask: tuple[str, Sequence[Dim]] | None, metadata: Mapping[str, str]) -> tuple[str, str] | None:
    """(layout, why) where the file settles it beyond a declaration: a valid metadata 'layout',
    mha-verify's export metadata, or shared axes that all say one layout; else None. (An invalid
    metadata value is what a declaration replaces, not a contradiction.)"""
    said = metadata.get("layout", "").replace("_", "-")
    if said in LAYOUTS:
        return said, f"the model's metadata 'layout' is {metadata['layout']!r}"
    if metadata.keys() >= _EXPORT_METADATA:
        return "batch-first", "mha-verify's export metadata"
    votes = _shared_axis_votes(first, key, mask)
    found = [layout for layout, why in votes.items() if why]
    return (found[0], "; ".join(votes[found[0]])) if len(found) == 1 else None


def _shared_axis_votes(first: tuple[str, Sequence[Dim]], key: tuple[str, Sequence[Dim]] | None,
                       mask: tuple[str, Sequence[Dim]] | None) -> dict[str, list[str]]:
    """{layout: why} from the axes q shares with k and the mask: q and k share B, not their
    lengths; a mask's query axis is q's length axis."""
    name, dims = first
    votes: dict[str, list[str]] = {"batch-first": [], "seq-first": []}
    if key is not None:
        kname, kd = key
        if _same(dims[0], kd[0]) and _distinct(dims[1], kd[1]):
            votes["batch-first"].append(f"{name} and {kname} share axis 0 ({dims[0]!r}) but not axis 1")
        if _same(dims[1], kd[1]) and _distinct(dims[0], kd[0]):
            votes["seq-first"].append(f"{name} and {kname} share axis 1 ({dims[1]!r}) but not axis 0")
    if mask is not None and len(mask[1]) >= 3:
        mname, md = mask
        if _same(md[-2], dims[1]) and not _same(md[-2], dims[0]):
            votes["batch-first"].append(f"mask {mname}'s query axis is {name}'s axis 1 ({dims[1]!r})")
        if _same(md[-2], dims[0]) and not _same(md[-2], dims[1]):
            votes["seq-first"].append(f"mask {mname}'s query axis is {name}'s axis 0 ({dims[0]!r})")
    return votes


def read_mask_axes(mask: tuple[str, Sequence[Dim]], batch: Dim, lq: Dim, lk: Dim, metadata: Mapping[str, str],
                   declared: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """(labels, source) of each axis of the mask input (name, dims), given q's B and Lq and k's Lk dims."""
    name, dims = mask
    rank = len(dims)
    for text, source in ((declared.get("mask_axes"), "declared"), (metadata.get("mask_axes"), "metadata")):
        if text is not None:
            labels = tuple(part.strip() for part in text.split(","))
            where = "--mask-axes" if source == "declared" else "the model's metadata 'mask_axes'"
            bad = [label for label in labels if label not in MASK_AXES]
            if bad or len(set(labels)) != len(labels) or labels[-1:] != ("Lk",):
                raise ValueError(f"{where} takes distinct axes from {', '.join(MASK_AXES)} ending in Lk, got {text!r}")
            if len(labels) != rank:
                raise ValueError(f"{where} names {len(labels)} axes ({text!r}), but mask input {name} has rank {rank}")
            if "B*H" in labels and ({"B", "H"} & set(labels) or labels[0] != "B*H"):
                raise ValueError(f"{where}: B*H is the first axis and replaces B and H, got {text!r}")
            return labels, source
    if rank == 4:
        return ("B", "H", "Lq", "Lk"), "rank 4"
    if rank == 3:
        first = dims[0]
        if isinstance(first, str) and _BH_NAME.search(first):
            return ("B*H", "Lq", "Lk"), f"its first axis is named {first!r}"
        if first == 1 or _same(first, batch):
            return ("B", "Lq", "Lk"), "rank 3, first axis B" + (f" ({batch!r})" if first != 1 else " (1)")
        raise Ambiguous(f"cannot tell whether the first axis {first!r} of mask input {name} {_show(dims)} is B or B*H "
                        f"(B is {batch!r}): pass --mask-axes B,Lq,Lk or --mask-axes B*H,Lq,Lk")
    if "padding" in name.lower():
        return ("B", "Lk"), f"named {name!r}: a key padding mask"
    first = dims[0]
    if _same(first, batch) and not _same(first, lq):
        return ("B", "Lk"), f"its first axis is B ({batch!r})"
    if _same(first, lq) and not _same(first, batch):
        return ("Lq", "Lk"), f"its first axis is Lq ({lq!r})"
    raise Ambiguous(f"cannot tell whether mask input {name} {_show(dims)} is (B, Lk) or (Lq, Lk) (B is {batch!r}, "
                    f"Lq is {lq!r}): pass --mask-axes B,Lk or --mask-axes Lq,Lk")


def read_mask_kind(name: str, is_bool: bool, metadata: Mapping[str, str], declared: Mapping[str, str],
                   ) -> tuple[str, str, bool]:
    """(kind, source, declared) of the mask input ``name``: bool masks default to ONNX's keep
    (True = may attend), float masks to additive (-inf removes); torch's ``key_padding_mask``
    name says drop."""
    allowed = BOOL_KINDS if is_bool else FLOAT_KINDS
    what = f"mask input {name} ({'bool' if is_bool else 'float'})"
    if "mask_kind" in declared:
        kind = _checked(declared["mask_kind"], allowed, f"--mask-kind for {what}")
        said = metadata.get("mask_kind")
        if said in allowed and said != kind:
            raise ValueError(f"--mask-kind {kind} contradicts the model: the metadata 'mask_kind' of {what} is "
                             f"{said!r}: pass --mask-kind {said} or leave it out")
        return kind, "declared", True
    if "mask_kind" in metadata:
        return _checked(metadata["mask_kind"], allowed, f"the metadata 'mask_kind' of {what}"), "metadata", True
    if is_bool and "key_padding_mask" in name.lower():
        return "drop", f"named {name!r}: torch's True = ignore this key", True
    if is_bool:
        return "keep", "default for bool masks: True = may attend (ONNX Attention, SDPA)", False
    return "additive", "default for float masks: added to the scores, -inf removes", False


def parse_conventions(text: str | None) -> dict[str, str]:
    """``"fully_masked=uniform,causal=true"`` -> {"fully_masked": "uniform", ...}; ValueError naming
    an unknown key or value, or a key given twice (which of its values was meant is not ours to pick)."""
    out: dict[str, str] = {}
    given: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in CONVENTIONS:
            raise ValueError(f"--conventions takes KEY=VALUE pairs with KEY in {', '.join(CONVENTIONS)}, got {part!r}")
        if key in given:
            raise ValueError(f"--conventions gives {key} twice ({key}={given[key]!r} and {key}={value!r}): "
                             f"give each key once")
        given[key] = value
        out[key] = _convention(key, value, f"--conventions {key}")
    return out


def _convention(key: str, value: str, where: str) -> str:
    """A convention's value checked: one of its values, for ``scale`` a positive finite number, for
    ``rotary`` a :meth:`~mha_verify.mha.rotary.Rotary.text`."""
    if key == "rotary":
        try:
            return Rotary.parse(value).text()
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if key != "scale":
        return _checked(value, CONVENTIONS[key], where)
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{where} must be a positive number, got {value!r}")
    return repr(number)


def read_conventions(metadata: Mapping[str, str], from_ops: Mapping[str, str],
                     declared: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{key: (value, source)} of :data:`CONVENTIONS`: declared, else the metadata, else what the
    model's attention operators state; a key none of them states is absent (the contract)."""
    out: dict[str, tuple[str, str]] = {}
    for key in CONVENTIONS:
        for source, values in (("declared", declared), ("metadata", metadata), ("the attention operator", from_ops)):
            if key in values:
                out[key] = (_convention(key, values[key], f"{key} ({source})"), source)
                break
    return out


def _checked(value: str, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise ValueError(f"{where} must be one of {', '.join(allowed)}, got {value!r}")
    return value
