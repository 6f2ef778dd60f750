"""What a layer of a library the harness does not know does with its mask, read from its source: the
forward and the functions and methods it calls (:func:`forward_source.forward_sources`).

Mask polarity is never read from outputs (a polarity bug would become a "convention"); the source says
it: ``masked_fill(~mask, ...)`` or ``masked_fill(mask == 0, ...)`` keeps where True, ``masked_fill(mask,
...)`` removes where True, ``scores + mask`` adds it. Its shape too: ``repeat(mask, 'b j -> ...')``,
``rearrange(mask, 'b j -> b 1 1 j')``, ``mask[:, None, None, :]`` or ``mask.unsqueeze(1).unsqueeze(2)`` take
key padding (B, Lk). What a
fully masked row gives follows from the fill: a finite one (``-torch.finfo(dtype).max``, ``-1e9``)
gives uniform weights, ``-inf`` NaN. A forward that reads its mask only as a switch
(``is_causal=mask is not None``, whisper's SDPA path) takes no mask the harness can draw.

Where the source says none of this, SDPA's convention holds (bool True = keep, float additive, any
shape broadcasting to (B, H, Lq, Lk)), as for any layer the harness does not know.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from mha_verify.properties.adapters.signature import MaskFormat

#: the mask and what it is renamed to on its way (``attn_mask``, a tiled softmax's ``row_mask``/``col_mask``);
#: never another mask of the layer (a causal one it builds, a ``key_padding_mask`` beside it)
_NAME = r"(?:(?:row_|col_|block_|chunk_)?mask|attn_mask|attention_mask|{name})"


@dataclass(frozen=True)
class MaskReading:
    """What the source says of the mask: kind ("keep", "drop", "additive") and layout (MaskFormat's),
    the types it takes, the fully masked convention ("uniform", "nan"), each None where unsaid; a
    switch: the line where the mask is read only as a flag."""

    kind: str | None = None
    layout: str | None = None
    takes: frozenset[str] | None = None
    fully_masked: str | None = None
    switch: str | None = None
    how: tuple[str, ...] = ()
    unsupported: str | None = None  # a mask of a form the harness does not draw, in words

    def format(self, default: MaskFormat) -> MaskFormat:
        return MaskFormat(kind=self.kind or default.kind, takes=self.takes or default.takes,
                          layout=self.layout or default.layout)


#: what may follow the mask's name before it is used: ``.unsqueeze(1)``, ``.bool()``, ``[:, None]``
_CHAIN = r"(?:\.\w+\([^()]*\)|\[[^\]]*\])*"
# what leaves an added mask the bias it was: a reshape or a cast (MONAI's Swin windows add
# ``mask.unsqueeze(1).unsqueeze(0)``), never a reduction or another method
_RESHAPES = r"(?:\.(?:unsqueeze|view|reshape|expand|expand_as|to|type_as|float|half|contiguous)\([^()]*\))*"


def _name(name: str, others: tuple[str, ...]) -> str:
    """:data:`_NAME` for mask ``name``, less the spellings that are other mask arguments of the same
    forward (vit-pytorch's ``forward(x, context, mask, attn_mask)``: each its own mask)."""
    spellings = [r"(?:row_|col_|block_|chunk_)mask" if "mask" in others else r"(?:row_|col_|block_|chunk_)?mask",
                 *(n for n in ("attn_mask", "attention_mask") if n not in others), re.escape(name)]
    return "(?:" + "|".join(spellings) + ")"


def _patterns(name: str, others: tuple[str, ...] = ()) -> dict[str, re.Pattern[str]]:
    m = _name(name, others) if others else _NAME.format(name=re.escape(name))
    c = _CHAIN
    return {
        "keep": re.compile(rf"masked_fill_?\(\s*(?:~\s*{m}\b|{m}{c}\s*==\s*0\b|{m}\.logical_not\(\)"
                           rf"|torch\.logical_not\(\s*{m}\s*\)|{m}\s*==\s*False\b)|\.where\(\s*{m}\s*,"
                           rf"|torch\.where\(\s*{m}\s*,\s*\w+\s*,"),
        "drop": re.compile(rf"masked_fill_?\(\s*{m}{c}\s*,"),
        "additive": re.compile(rf"[+]\s*=?\s*{m}\b{_RESHAPES}(?!\s*\.)|\b{m}\s*(?:\[[^\]]*\]\s*)?\+(?!\+)"
                               rf"|[+]\s*{m}\s*\["),
        # masked weights zeroed after the exponential (a tiled softmax's ``exp.masked_fill_(~mask, 0.)``):
        # a fully masked row sums to 0 and gives zeros, whatever the fill before
        "zeroed": re.compile(rf"\bexp\w*\.masked_fill_?\(\s*~\s*{m}\s*,\s*0(?:\.0*)?\s*\)"),
        "bool_only": re.compile(rf"~\s*{m}\b|{m}\.logical_not\(\)"),
        # any mask turned to bool (kornia's SigLIP2: ``attention_mask.bool()``): a float one is 1/0, never biases
        "to_bool": re.compile(rf"\b{m}{c}\.bool\(\)|\b{m}{c}\.to\(\s*(?:dtype\s*=\s*)?torch\.bool\s*\)"),
        "zero_test": re.compile(rf"masked_fill_?\(\s*{m}{c}\s*==\s*0\b"),
        "key_padding": re.compile(rf"(?:rearrange|repeat)\(\s*{m}\s*,\s*['\"]b\s+(?:j|n|s|k)\s*->"
                                  rf"|\b{m}\s*\[\s*:\s*,\s*None\s*,\s*None\s*,\s*:\s*\]"
                                  rf"|\b{m}\s*\[\s*:\s*,\s*None\s*,\s*None\s*\]"
                                  # MONAI's ``attn_mask.unsqueeze(1).unsqueeze(2)``: (B, Lk) -> (B, 1, 1, Lk)
                                  rf"|\b{m}\.unsqueeze\(\s*1\s*\)\.unsqueeze\(\s*[12]\s*\)"),
        # fairseq's ``attn_mask = attn_mask.unsqueeze(0)``: one (Lq, Lk) mask for every item and head
        "shared": re.compile(rf"\b{m}\s*=\s*{m}\.unsqueeze\(\s*0\s*\)"),
        # torch MHA's own conversion written out: a bool mask turned into an additive one where True, a
        # float mask added as it is (``zeros_like(mask, dtype=q.dtype).masked_fill_(mask, float("-inf"))``)
        # or in two lines (open_clip's ``new = torch.zeros_like(mask, dtype=q.dtype)``, then
        # ``new.masked_fill_(mask, float("-inf"))``)
        "bool_to_additive": re.compile(rf"zeros_like\(\s*{m}\b[^\n]*\.masked_fill_?\(\s*{m}\s*,"
                                       rf"|\b(\w+)\s*=\s*(?:torch\.)?zeros_like\(\s*{m}\b[^\n]*\n\s*\1\.masked_fill_?\("
                                       rf"\s*{m}\s*,"),
        # the Annotated Transformer's ``mask = mask.unsqueeze(1)``: a head axis put in a (B, Lq, Lk) mask
        "per_item": re.compile(rf"\b{m}\s*=\s*{m}\.unsqueeze\(\s*1\s*\)"),
        "square": re.compile(rf"\b{m}\s*\[\s*:[^,\]\[]*(?:\[[^\]]*\][^,\]\[]*)?,\s*:[^\]\[]*(?:\[[^\]]*\][^\]\[]*)?\]"),
        "causal_reuse": re.compile(rf"\b{m}\s*=\s*torch\.(?:ones|full|zeros|empty)\([^\n]*\.(?:triu|tril)_?\("),
        # a token mask applied to the queries as well (ats-vit's ``rearrange(mask, 'b i -> b 1 i 1') * ...``)
        "queries_too": re.compile(rf"(?:rearrange|repeat)\(\s*{m}\s*,\s*['\"]b\s+i\s*->\s*b\s+1\s+i\s+1['\"]"),
        "sdpa": re.compile(rf"scaled_dot_product_attention\([^)]*attn_mask\s*=\s*{m}\b"),
        "switch": re.compile(rf"is_causal\s*=\s*{m}\s+is\s+not\s+None[^\n,)]*"),
        # labml's sequence-first layers: ``mask[i, j, b]``, batch last, checked against the queries' batch
        # axis (``assert mask.shape[2] == 1 or mask.shape[2] == query_shape[1]``)
        "batch_last": re.compile(rf"\b{m}\.shape\[2\]\s*==\s*(?:1\s+or\s+{m}\.shape\[2\]\s*==\s*)?"
                                 rf"\w+(?:\.shape)?\[1\]"),
    }


_FINITE_FILL = re.compile(r"-\s*torch\.finfo\([^)]*\)\.max|torch\.finfo\([^)]*\)\.min|-\s*1e\+?\d+\b|-\s*10000\b")
#: a source that deals with rows left without a key itself (``nan_to_num``, a ``has_key`` test on the row's
#: maximum), after the mask is applied: what such a row gives is not the fill's to say
#: (a row maximum subtracted for stability, ``weight - weight.amax(...)``, guards nothing: only one
#: compared, ``amax(...) > -inf``, is a has-key test)
_GUARDED = re.compile(r"nan_to_num|\.amax\([^()]*(?:\([^()]*\)[^()]*)*\)\s*(?:[<>]=?|==|!=)|\bhas_key\b"
                      r"|isinf\(|isfinite\(|isnan\(|\.all\(\s*dim\s*=\s*-1")
_INF_FILL = re.compile(r"float\(\s*['\"]-inf['\"]\s*\)|-\s*(?:np|numpy|math|torch)\.inf\b|-\s*float\(\s*['\"]inf")


@functools.lru_cache(maxsize=256)
def read_mask(sources: tuple[tuple[str, str], ...], name: str, others: tuple[str, ...] = ()) -> MaskReading:
    """The :class:`MaskReading` of the mask parameter ``name`` in ``sources`` ((where, text) pairs);
    ``others``: the forward's other mask arguments, whose uses say nothing of this one."""
    p = _patterns(name, others)
    text = "\n".join(source for _, source in sources)
    how: list[str] = []

    def where(pattern: re.Pattern[str]) -> str:
        for place, source in sources:
            hit = pattern.search(source)
            if hit:
                return f"`{' '.join(hit.group(0).split())}` in {place}"
        return ""

    if p["queries_too"].search(text):
        return MaskReading(unsupported=f"it masks the queries as well as the keys ({where(p['queries_too'])}), a "
                                       "form of mask the harness does not draw")
    switch = p["switch"].search(text)
    if switch and not (p["keep"].search(text) or p["drop"].search(text)):
        # a mask turned into a flag and never applied (its other path may add it: not the path run)
        return MaskReading(switch=where(p["switch"]))
    inverted = _inverted_for_sdpa(sources, name)
    if inverted:  # speechbrain's masks_union: True = ignored, inverted into SDPA's keep-mask
        return MaskReading(kind="drop", takes=frozenset({"bool"}), how=(
            f"mask removed where True: handed to {inverted}, whose result goes to SDPA's attn_mask; bool only",))
    kinds = [k for k in ("keep", "drop", "additive") if p[k].search(text)]
    if "drop" in kinds and len(kinds) > 1 and p["causal_reuse"].search(text):
        kinds.remove("drop")  # the name reused for a causal mask of its own (``mask = ones(i, j).triu(1)``)
    kind = kinds[0] if len(kinds) == 1 else None
    both = sorted(kinds) == ["additive", "drop"] and p["bool_to_additive"].search(text)
    if both:
        kind = "drop"
        how.append(f"a bool mask removes keys where True and a float mask is added, torch MHA's convention "
                   f"({where(p['bool_to_additive'])})")
    elif kind:
        said = {"keep": "kept where True", "drop": "removed where True", "additive": "added"}[kind]
        how.append(f"mask {said} ({where(p[kind])})")
    layout = "BL" if p["key_padding"].search(text) else "LLB" if p["batch_last"].search(text) else None
    if layout == "BL":
        how.append(f"key padding (B, Lk) ({where(p['key_padding'])})")
    elif layout == "LLB":
        how.append(f"shaped (Lq, Lk, B), batch last ({where(p['batch_last'])})")
    elif p["per_item"].search(text):
        layout = "BLL"
        how.append(f"shaped (B, Lq, Lk), a head axis put in by the layer ({where(p['per_item'])})")
    elif kind == "additive" and (p["square"].search(text) or p["shared"].search(text)):
        layout = "LL"
        shared = p["square"] if p["square"].search(text) else p["shared"]
        how.append(f"one (L, L) mask for every item and head ({where(shared)})")
    # ``~mask`` takes bools only; ``mask == 0`` reads a float mask as 0/1, never as additive biases
    takes = frozenset({"bool"}) if kind in ("keep", "drop") and (p["bool_only"].search(text)
                                                                 or p["zero_test"].search(text)) else None
    if kind in (None, "keep", "drop") and p["to_bool"].search(text):
        takes = frozenset({"bool"})
        how.append(f"any mask turned to bool, a float one read as 1/0 ({where(p['to_bool'])}): drawn as bool only")
    if both:
        takes = frozenset({"bool", "float"})
    applied = p[kind].search(text) if kind else None
    # a guard before the mask is applied (torchscale's ``nan_to_num`` of the raw scores) guards nothing
    guarded = bool(_GUARDED.search(text, applied.start() if applied else 0))
    fully = None
    if p["sdpa"].search(text):
        pass  # a path through SDPA gives what SDPA gives on a fully masked row, whatever another path's fill
    elif kind == "keep" and p["zeroed"].search(text):
        fully = "zeros"
        how.append(f"a fully masked row gets zeros (its weights zeroed: {where(p['zeroed'])})")
    elif kind in ("keep", "drop") and not guarded and not both:
        fully = "uniform" if _FINITE_FILL.search(text) and not _INF_FILL.search(text) else \
            "nan" if _INF_FILL.search(text) and not _FINITE_FILL.search(text) else None
        if fully:
            how.append("a fully masked row gets " + ("uniform weights (a finite fill)" if fully == "uniform"
                                                      else "NaN (an -inf fill)"))
    if (kind == "additive" or both) and not guarded:  # added before a softmax: a row of -inf gives NaN
        fully = "nan"
        how.append("a fully masked row gets NaN (the mask added before a softmax)")
    return MaskReading(kind=kind, layout=layout, takes=takes, fully_masked=fully, how=tuple(how))


def read_fill(sources: tuple[tuple[str, str], ...]) -> str | None:
    """What a fully masked row gives where the source fills masked scores with one constant: "uniform"
    (a finite fill), "nan" (-inf), None where it says neither or both."""
    text = "\n".join(source for _, source in sources)
    if _GUARDED.search(text):
        return None
    finite, inf = bool(_FINITE_FILL.search(text)), bool(_INF_FILL.search(text))
    return "uniform" if finite and not inf else "nan" if inf and not finite else None


#: a row of scores shifted by its own max over the keys (a stable softmax written out)
_ROW_MAX_SHIFT = re.compile(r"\b(\w+)\s*-\s*\1\s*\.\s*(?:max|amax)\(\s*(?:dim\s*=\s*)?-1\s*,\s*keepdim\s*=\s*True\s*\)")


def read_shift(sources: tuple[tuple[str, str], ...], name: str) -> str | None:
    """Where one source shifts a row of scores by its max over every key before it applies mask ``name``
    (speechbrain's BEATs layer), the shift as written, whitespace collapsed; None otherwise."""
    applied = re.compile(rf"[+]\s*=?\s*{_NAME.format(name=re.escape(name))}\b|masked_fill_?\(")
    for _, source in sources:
        shift = _ROW_MAX_SHIFT.search(source)
        mask = applied.search(source, shift.end()) if shift else None
        if shift and mask:
            return " ".join(shift.group(0).split())
    return None


def _inverted_for_sdpa(sources: tuple[tuple[str, str], ...], name: str) -> str | None:
    """Where the forward hands mask ``name`` to a helper of its module that returns it inverted
    (``torch.logical_not``, ``~``), and the helper's result is SDPA's ``attn_mask`` (speechbrain's
    ``final_masks = masks_union(bsz, klen, heads, attn_mask, key_padding_mask)``), the helper's call in
    words; None otherwise."""
    forward = sources[0][1] if sources else ""
    helpers = {place.split(" ")[0]: text for place, text in sources[1:]}
    for hit in re.finditer(rf"\b(\w+)\s*=\s*(\w+)\(([^()]*\b{re.escape(name)}\b[^()]*)\)", forward):
        result, helper = hit.group(1), hit.group(2)
        body = helpers.get(helper, "")
        sdpa = forward.find("scaled_dot_product_attention(")
        if sdpa >= 0 and re.search(rf"\battn_mask\s*=\s*{re.escape(result)}\b", forward[sdpa:]) \
                and re.search(r"return\s+~|logical_not\(", body):
            return f"`{' '.join(hit.group(0).split())}`, which inverts it"
    return None
