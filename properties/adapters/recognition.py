"""What the harness knows of other libraries' attention layers, as data: a new library is a row.

* :data:`PROJECTIONS`: the names layers give their projections, per layout, as the adapters
  recognize them (``adapters.base``, ``adapters.projections``), and the tokens that name a projection's
  initializer in an ONNX graph (``onnx.weights.projection_weights``) derive from the same rows.
* :data:`LIBRARY_FORMATS`: what a library means by the mask its layers take, and what they give
  on a fully masked row. Never inferred from outputs, which would turn a polarity bug into a
  "convention".
"""

from __future__ import annotations

from dataclasses import dataclass

from mha_verify.properties.adapters.signature import MaskFormat


@dataclass(frozen=True)
class Projections:
    """One naming of a layer's projections.

    q, k, v: the separate input projections, or None with ``fused``: one (3D, D) projection
    chunked into q, k, v in that order, or with ``per_head`` into the q, k and v rows of each
    head in turn (GPT-NeoX's (H, 3 Hd) view). out: the candidate names of the output projection
    (empty: the layer has none, as HF BERT's self-attention).
    """

    layout: str
    q: str | None
    k: str | None
    v: str | None
    out: tuple[str, ...]
    fused: str | None = None
    where: str = ""
    per_head: bool = False


PROJECTIONS: tuple[Projections, ...] = (
    Projections("w_qkvo", "w_q", "w_k", "w_v", ("w_o",), where="seed 000, mha_verify.mha.MultiHeadAttention"),
    Projections("query_key_value", "query", "key", "value", ("fc_out",), where="seed 001"),
    Projections("linear_qkv", "linear_q", "linear_k", "linear_v", ("out",), where="seed 002"),
    Projections("fused_qkv", None, None, None, ("proj", "projection"), fused="qkv", where="timm; HF BLIP, BLIP-2"),
    Projections("fused_qkv", None, None, None, ("o_proj",), fused="qkv_proj", where="HF Phi-3 (grouped-query)"),
    Projections("fused_qkv", None, None, None, ("c_proj",), fused="c_attn", where="nanoGPT, GPT-2 (HF Conv1D)"),
    Projections("fused_qkv", None, None, None, ("dense",), fused="query_key_value", per_head=True,
                where="HF GPT-NeoX (q, k, v rows of each head in turn)"),
    Projections("separate_qkv", "q_proj", "k_proj", "v_proj", ("o_proj", "out_proj", "output_proj"),
                where="HF Llama, Mistral, BART, Whisper; fairseq; torchtune"),
    Projections("separate_qkv", "to_q", "to_k", "to_v", ("to_out",),
                where="x-transformers; diffusers (to_out a ModuleList: [Linear, Dropout])"),
    Projections("separate_qkv", "q_lin", "k_lin", "v_lin", ("out_lin",), where="HF DistilBERT"),
    Projections("separate_qkv", "q", "k", "v", ("o",), where="HF T5 and its family"),
    Projections("separate_qkv", "query", "key", "value", ("out_proj",), where="HF Grounding DINO"),
    Projections("qkv_no_output", "query", "key", "value", (), where="HF BertSelfAttention"),
)


#: children that normalize q and k before the scores (QK-norm: Qwen3, Gemma 3, OLMo 2, Chameleon,
#: Cohere, diffusers' ``qk_norm``), as (q, k) pairs of names; what they compute is probed
#: (:mod:`mha_verify.properties.adapters.qk_norm`) and the oracle applies it
QK_NORM_PAIRS = (("q_norm", "k_norm"), ("query_norm", "key_norm"), ("q_layernorm", "k_layernorm"),
                 ("norm_q", "norm_k"), ("q_ln", "k_ln"))
#: children that normalize the values the same way (Gemma 4's weightless ``v_norm``)
V_NORMS = ("v_norm", "value_norm", "v_layernorm", "norm_v", "v_ln")


def layouts(layout: str) -> tuple[Projections, ...]:
    """The rows of one layout, in matching order."""
    return tuple(p for p in PROJECTIONS if p.layout == layout)


def names_of(layout: str) -> tuple[str, str, str, str]:
    """(q, k, v, out) of a layout with exactly one naming (the exact adapters)."""
    (row,) = layouts(layout)
    assert row.q and row.k and row.v and row.out
    return row.q, row.k, row.v, row.out[0]


#: tokens of an ONNX initializer's name that say which projection it is (besides the names above)
_EXTRA_TOKENS = {"q": ("q", "wq"), "k": ("k", "wk"), "v": ("v", "wv"), "o": ("o", "out", "wo", "dense", "proj_out")}


def initializer_tokens() -> dict[str, tuple[str, ...]]:
    """Per role (q, k, v, o), the name tokens that mark an initializer as that projection."""
    tokens: dict[str, list[str]] = {role: list(extra) for role, extra in _EXTRA_TOKENS.items()}
    for row in PROJECTIONS:
        for role, name in (("q", row.q), ("k", row.k), ("v", row.v)):
            if name:
                tokens[role].append(name)
        tokens["o"] += row.out
    return {role: tuple(dict.fromkeys(names)) for role, names in tokens.items()}


@dataclass(frozen=True)
class LibraryFormat:
    """How one library's layers take their mask: its format, the fully masked convention, in words."""

    mask: MaskFormat
    fully_masked: str
    note: str


#: (library, attention implementation or None for any) -> its mask format. transformers layers
#: get the mask the model would build for their implementation (``config._attn_implementation``;
#: a layer built standalone runs HF's eager code).
LIBRARY_FORMATS: dict[tuple[str, str | None], LibraryFormat] = {
    ("transformers", "eager"): LibraryFormat(
        MaskFormat("additive_min", layout="BHLL4"), "uniform",
        "transformers eager: the mask as HF builds it, finfo.min for removed keys (uniform weights on fully masked "
        "rows)"),
    # sdpa_attention_forward turns a bool mask into where(mask, position_bias, finfo.min) for layers
    # with a position bias (T5 and its family): fully masked rows get uniform weights
    ("transformers", "sdpa+position_bias"): LibraryFormat(
        MaskFormat("keep", layout="BHLL4"), "uniform",
        "transformers sdpa with a position bias: a bool mask becomes where(mask, bias, finfo.min) (uniform weights "
        "on fully masked rows)"),
    ("transformers", "eager+position_bias"): LibraryFormat(
        MaskFormat("additive_min", layout="BHLL4"), "uniform",
        "transformers eager: the mask as HF builds it, finfo.min for removed keys, added to the position bias "
        "(uniform weights on fully masked rows)"),
    ("transformers", None): LibraryFormat(
        MaskFormat("keep", layout="BHLL4"), "zeros",
        "transformers {impl}: the mask as HF builds it for sdpa (bool keep)"),
    ("torchtune", None): LibraryFormat(
        MaskFormat("keep", layout="BLL"), "zeros", "torchtune: bool keep-mask (B, Lq, Lk)"),
    # x-transformers' attend() inverts the mask with ~: bool only
    ("x_transformers", None): LibraryFormat(
        MaskFormat("keep", takes=frozenset({"bool"})), "zeros",
        "x-transformers: attn_mask as a bool keep-mask (bool only)"),
    ("timm", None): LibraryFormat(MaskFormat("keep"), "zeros", "timm: attn_mask as SDPA takes it"),
    # Attention.prepare_attention_mask repeats a (B, Lq, Lk) mask over heads and adds it to the scores
    # the classic processor (AttnProcessor) adds the mask in baddbmm and takes softmax: NaN on a -inf row
    ("diffusers", "get_attention_scores"): LibraryFormat(
        MaskFormat("additive", layout="BLL"), "nan",
        "diffusers' classic processor: attention_mask additive, (B, Lq, Lk), softmax of the scores (NaN on fully "
        "masked rows)"),
    ("diffusers", "prepare_attention_mask"): LibraryFormat(
        MaskFormat("additive", layout="BLL"), "zeros", "diffusers: attention_mask additive, (B, Lq, Lk)"),
    # a processor without prepare_attention_mask (BriaFibo2's) hands the mask to attention as is: a
    # (B, Lq, Lk) mask would broadcast as (1, B, Lq, Lk), one item's mask on each head, and a 2-D one
    # is read as key padding
    ("diffusers", None): LibraryFormat(
        MaskFormat("keep", layout="BHLL4"), "zeros",
        "diffusers: a processor that hands attention_mask to attention as is (no prepare_attention_mask), as SDPA "
        "takes it at rank 4 (a 2-D mask is key padding (B, Lk) to its dispatch)"),
}
#: libraries that leave the values of a fully masked query row unspecified, with the evidence. A
#: fully masked row is a padding query; what it gives never reaches a kept position's output.
UNSPECIFIED_ROWS: dict[str, str] = {
    "transformers": (
        "transformers treats a fully masked query row (a padding query) as don't-care: its SDPA masks un-masked "
        "such rows to avoid NaN, which 'does not change the final result' (sdpa_mask's allow_torch_fix in 4.x, "
        "from huggingface/transformers#26572: 'we modify it only for pad tokens'), so what such a row gives differs "
        "between its mask paths by design"),
}
UNKNOWN_LIBRARY = LibraryFormat(
    MaskFormat("keep"), "zeros", "mask convention: SDPA's default for a layer we do not know (bool True = keep)")


def library_format(library: str, implementation: str | None) -> LibraryFormat:
    """The row for ``library`` (the top-level package of a layer's class) running ``implementation``."""
    row = LIBRARY_FORMATS.get((library, implementation)) or LIBRARY_FORMATS.get((library, None))
    if row is None:
        return UNKNOWN_LIBRARY
    return LibraryFormat(row.mask, row.fully_masked, row.note.replace("{impl}", str(implementation)))
