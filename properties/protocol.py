"""The target protocol: what every target of the harness is, eager module or onnxruntime session.

A :class:`Subject` is something to verify (a module class, a factory, an ONNX model in one
provider and optimization level); ``build`` gives an :class:`Instance` at given sizes, which
is what a property calls. Both are typing Protocols: an implementation subclasses nothing and
mypy checks it against them (``properties.targets`` for eager modules,
``properties.onnx.ort_target`` for onnxruntime sessions).

Calling convention of every instance, ours:

    instance(q (B, Lq, D), k (B, Lk, D), v (B, Lk, D), mask) -> output (B, Lq, D)

with ``mask`` None, a bool keep-mask (True = may attend) or an additive float mask,
broadcasting to (B, H, Lq, Lk). A call the target cannot express raises
:class:`NotApplicable`: the example compared nothing, it is neither pass nor fail.

This module depends on nothing of the harness: only on torch and the mask vocabulary of
``mha.masks`` (the layer below everything).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from mha_verify.mha.masks import FULLY_MASKED, MASK_FORMS, causal_alignment
from mha_verify.mha.rotary import Rotary
from mha_verify.mha.scoring import KV_MAPS, Norm, PositionBias, Scoring

if TYPE_CHECKING:
    from mha_verify.mha.reference import MHAParams


class NotApplicable(Exception):  # noqa: N818 -- a verdict, not an error
    """The target cannot express this call (no mask argument, self-attention only, ...)."""


class TargetError(Exception):
    """A target cannot be loaded or built as asked (a usage error: exit code 2)."""


@dataclass(frozen=True)
class Conventions:
    """What a target supports and how it behaves, as its adapter found it or its author declared it.

    The runner decides from these, before a property runs, whether the property applies.

    mask: the mask types the target takes natively, a subset of {"bool", "float"}; empty
        when its forward takes no mask.
    mask_forms: the mask shapes it accepts, a subset of :data:`mha.masks.MASK_FORMS`.
    cross_attention: False for self-attention-only targets (forward(x)).
    kv_shared: keys and values arrive as one argument (HF's ``key_value_states``, diffusers'
        ``encoder_hidden_states``): cross-attention examples then have k = v != q, Lk != Lq.
    weights: True if the target can return attention weights (B, H, Lq, Lk).
    fully_masked: what a fully masked query row gives (:data:`mha.masks.FULLY_MASKED`):
        "zeros" (our contract: w_o(0) = b_o), "uniform" (weights 1/Lk over all keys, as layers
        that mask with finfo.min compute), "uniform_visible" (over the keys the layer's own causal
        mask of finfo.min leaves) or "nan" (e.g. torch.nn.MultiheadAttention); declared or read
        from the layer's structure, never inferred from outputs.
    rows_unspecified: why the layer's library leaves the values of a fully masked row unspecified
        (don't-care: the row is a padding query), read from the recognition tables; None where the
        contract's value is owed. Such rows must still be finite (NaN x 0 is NaN downstream); a value
        other than ``fully_masked`` is then a finding "unspecified by its library", not a failure.
    mask_lengths: the forward takes key padding as lengths (B,) (right padding only): masks are drawn as right
        padding, and a property's own mask that is not (a permuted or per-query one) is n/a for that example.
    mask_unsupported: where the forward takes a mask of a form the harness does not draw (a token mask
        applied to queries as well as keys), in words: the mask properties are n/a with it, no finding.
    mask_ignored: where the forward takes a mask argument that its own source says it does not use,
        those words (``mask`` is then empty): the mask properties are n/a of kind "ignored".
    context_ignored: where the forward takes keys and values (``encoder_hidden_states``) and never
        reads them, why (``cross_attention`` is then False): the cross-attention properties are n/a
        of kind "ignored", and the layer is verified as the self-attention it computes.
    causal: the target applies a causal mask itself: False, "top_left" (query i sees keys j <= i, SDPA's
        ``is_causal``) or "bottom_right" (keys j <= i + Lk - Lq: a KV-cache decode step, torch's
        ``causal_lower_right``); True is taken as "top_left" (:data:`mha.masks.CAUSAL_ALIGNMENTS`).
        Truthy exactly when causal.
    grads: gradients can be taken through it (False for an onnxruntime session).
    grads_refused: where a function the layer calls refuses autograd (FlexAttention has no backward on
        the CPU), its words: the layer is then called without gradients (``grads`` False), and the gradient
        properties are n/a of kind inherited; None otherwise.
    dropout: it has a dropout probability the harness can set (False: none, or not settable).
    dropout_declared: where its library declares that its attention dropout acts in training (a
        transformers config's ``attention_dropout``), in words; a dropout that then never acts is a
        failure, not an argument the layer ignores. None: nothing declares it.
    sizes: a fixed (d_model, n_head) (an exported model), or None: any size can be built.
    dtype: a fixed compute dtype (an exported model), or None: built in the dtype asked for.
    kv_heads: key/value heads for grouped-query attention, None for H (read from weights).
    kv_map: which query heads share a key/value head under grouped-query attention
        (:data:`mha.scoring.KV_MAPS`): "interleave" (query head i reads kv head i // g, HF's
        ``repeat_kv``) or "tile" (i % Hkv), declared or read; the oracle applies it.
    implementations: the attention implementations its library runs it through here, the one it is built
        with first (transformers' ``config._attn_implementation``: ``("sdpa", "eager")``); each other is
        held to the oracle beside it by ``eager_vs_sdpa``. Empty: one path only.
    kv_cache: the KV-cache protocol the target's forward takes, read from it (``"hf_cache"``: a
        transformers ``Cache`` argument and the layer's ``layer_idx``, :mod:`adapters.kv_cache`), or
        None: the target cannot be run position by position through a cache of its own.
    layout: how the target takes q, k, v and gives its output: "batch_first" (B, L, D), "seq_first"
        (L, B, D: fairseq's and speech layers'), or one of :data:`GRID_LAYOUTS` (a 4-D input that
        attends along one axis: a sequence given as one row, (B, 1, L, D) for "B1LD"); declared or read by
        a probe at load (:mod:`adapters.layout_probe`). The properties hand (B, L, D) over either way; the
        adapter moves the axes.
    torch_modes: torch's inference mode and training mode reach the computation (False for an
        onnxruntime session: it computes the same whatever torch's modes).
    output_dtype: the dtype of every output whatever the inputs' (a layer that always returns
        float32, say), declared; None: the output has the dtype of q (the contract).
    axes: (B, Lq, Lk) sizes the target is fixed to (an exported model with static axes), None
        for each axis it takes at any size; examples are drawn at the fixed sizes.
    scale: the softmax scale the target multiplies scores by, declared or read (an ONNX
        ``Attention``'s ``scale``); None: 1 / sqrt(Hd), the contract. The oracle applies it. Where the
        layer's library declares the scale (:mod:`adapters.spec`), it is the declared one, whatever the
        layer's code says.
    departures: where the layer's code departs from what its library declares it should compute, in
        words ("its code scales scores by 0.25 ... where its spec says 0.5 ..."): the oracle applies the
        spec, and each failure of a check against the oracle names the departure.
    rotary: rotary position embeddings the target applies to q and k (:class:`mha.rotary.Rotary`),
        declared or read from the layer's config; the oracle applies them, and examples draw
        only head widths they can rotate. None: no position information (the contract).
    q_norm, k_norm, v_norm: QK-norm (:class:`mha.scoring.Norm`), read from the layer's norm children
        (values normalized too in Gemma 4).
    input_norm, context_norm: norms over D inside the layer before its projections, of the queries'
        input and of the keys' and values' (vit-pytorch's ``x = self.norm(x)``: both, in a
        self-attention layer; the queries' alone where the context is projected raw); the oracle
        applies them.
    softcap: logit soft-capping cap * tanh(s / cap), declared or read from a config.
    position_bias: an additive bias per head (:class:`mha.scoring.PositionBias`): ALiBi
        (declared ``alibi``) or a table the layer computes (T5's ``compute_bias``).
    window: a sliding window of that many keys the target applies itself (:mod:`mha.scoring`).
    max_length: the longest sequence the target takes (the size of its own causal buffer, GPT-2's
        ``bias`` (1, 1, N, N)): examples are drawn with Lq and Lk up to it; None: any length.
    head_dim_multiple: head widths the target accepts are multiples of it, declared or read (a
        layer that runs its rotary code on pairs of columns even where the rotation is by 0);
        a rotary's own multiple applies besides.
    beyond: the steps the layer takes beyond the attention the oracle models, in words (a gate, a
        relative-position table, cosine-similarity scores), or None. Such a layer is verified by
        the laws alone (:data:`LAWS_ONLY`): a check against the oracle is n/a naming the steps, and
        relations between its outputs get allowances measured against its own float64 forward.
    shifted_scores: where the layer shifts each row of scores by its max over every key, masked ones
        included, before it applies the mask (speechbrain's BEATs: ``(w - w.max(dim=-1, keepdim=True)[0])
        * alpha``), the line, read from its source: softmax cancels the shift exactly, so a masked key
        reaches the output and its own gradient through rounding alone, which the mask checks report as
        a precision policy (within 64 times their allowance), not a FAIL; None otherwise.
    beyond_positional: a step of ``beyond`` makes its output depend on positions (a relative table,
        a rotary of its own): the permutation laws are n/a too.
    mixes_positions: a step of ``beyond`` that carries each position into its neighbours' q, k and v
        before the scores (Primer-EZ's convolution after its projections), in words: a mask removes a
        key from the scores only, so the laws about a masked key's k and v are n/a.
    mixes_future: where that step reaches a position from a later one, what the probe saw
        (:mod:`adapters.position_steps`): the causal laws are n/a too, unless the layer is causal itself;
        None where it reaches none.
    notes: the conventions in words, printed in the report.
    """

    mask: frozenset[str] = frozenset({"bool", "float"})
    mask_forms: frozenset[str] = frozenset(MASK_FORMS)
    cross_attention: bool = True
    kv_shared: bool = False
    weights: bool = False
    fully_masked: str = "zeros"
    rows_unspecified: str | None = None
    mask_ignored: str | None = None
    mask_unsupported: str | None = None
    mask_lengths: bool = False
    context_ignored: str | None = None
    shifted_scores: str | None = None
    causal: bool | str = False
    grads: bool = True
    grads_refused: str | None = None
    dropout: bool = True
    dropout_declared: str | None = None
    sizes: tuple[int, int] | None = None
    dtype: torch.dtype | None = None
    kv_heads: int | None = None
    kv_map: str = "interleave"
    kv_cache: str | None = None
    implementations: tuple[str, ...] = ()
    layout: str = "batch_first"
    torch_modes: bool = True
    output_dtype: torch.dtype | None = None
    axes: tuple[int | None, int | None, int | None] = (None, None, None)
    scale: float | None = None
    departures: tuple[str, ...] = ()
    rotary: Rotary | None = None
    q_norm: Norm | None = None
    k_norm: Norm | None = None
    v_norm: Norm | None = None
    input_norm: Norm | None = None
    context_norm: Norm | None = None
    softcap: float | None = None
    position_bias: PositionBias | None = None
    window: int | None = None
    max_length: int | None = None
    head_dim_multiple: int = 1
    beyond: str | None = None
    beyond_positional: bool = False
    mixes_positions: str | None = None
    mixes_future: str | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        # one spelling per convention: True -> "top_left"; ValueError naming any other value
        object.__setattr__(self, "causal", causal_alignment(self.causal) or False)

    @property
    def scoring(self) -> Scoring:
        """How the target forms its scores, as the oracle applies it (:class:`mha.scoring.Scoring`)."""
        return Scoring(scale=self.scale, rotary=self.rotary, q_norm=self.q_norm, k_norm=self.k_norm, v_norm=self.v_norm,
                       softcap=self.softcap, bias=self.position_bias, window=self.window, kv_map=self.kv_map,
                       input_norm=self.input_norm, context_norm=self.context_norm)

    def declare(self, declaration: Mapping[str, object], *, source: str = "declaration") -> Conventions:
        """These conventions with ``declaration`` applied; ValueError naming an unknown key or a bad value.

        Keys: mask (types: "bool", "float"), mask_forms, cross_attention, self_attention (its
        negation), kv_shared, weights, fully_masked, causal (True, False, "top_left", "bottom_right"), grads,
        dropout, kv_heads, kv_map ("interleave", "tile"), layout ("batch_first", "seq_first"), output_dtype
        ("float16", "bfloat16", "float32", "float64"), scale (a positive number, or None), rotary
        (None, or a mapping of base, interleaved, fraction, reverse: ``{"base": 10000.0}``), softcap (a
        positive number, or None), window (a positive int, or None), alibi (True: ALiBi's bias),
        head_dim_multiple (a positive int), max_length (a positive int, or None: the longest sequence).
        """
        changes: dict[str, object] = {}
        for key, value in declaration.items():
            if key not in _DECLARABLE:
                raise ValueError(f"{source}: unknown convention {key!r}; known: {', '.join(sorted(_DECLARABLE))}")
            name, parse = _DECLARABLE[key]
            try:
                changes[name] = parse(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{source}: {key}={value!r}: {exc}") from None
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> str:
        """One line: the conventions a verdict was reached under."""
        mask = "/".join(sorted(self.mask)) or "none"
        parts = [f"mask {mask}" + ("" if not self.mask or self.mask_forms == frozenset(MASK_FORMS)
                                   else f" ({', '.join(sorted(self.mask_forms))})"),
                 ("cross-attention, keys = values (one argument)" if self.kv_shared else "cross-attention")
                 if self.cross_attention else "self-attention",
                 f"fully masked rows -> {self.fully_masked}" + (" (unspecified by its library)"
                                                                if self.rows_unspecified else "")]
        if self.causal:
            parts.append("causal" if self.causal == "top_left" else "causal (bottom-right aligned)")
        if self.kv_heads:
            parts.append(f"{self.kv_heads} kv heads")
        if len(self.implementations) > 1:
            parts.append(f"built {self.implementations[0]}; also run {', '.join(self.implementations[1:])}")
        if self.layout == "seq_first":
            parts.append("sequence first (L, B, D)")
        elif self.layout == CHANNELS_FIRST:
            parts.append("channels first (B, D, L)")
        elif self.layout in GRID_LAYOUTS:
            parts.append(f"4-D inputs ({', '.join(self.layout)}): a sequence as one row")
        if self.sizes:
            parts.append(f"fixed d_model={self.sizes[0]}, n_head={self.sizes[1]}")
        if self.head_dim_multiple > 1:
            parts.append(f"head widths a multiple of {self.head_dim_multiple}")
        if self.dtype is not None:
            parts.append(str(self.dtype).replace("torch.", ""))
        if self.output_dtype is not None:
            parts.append(f"outputs {str(self.output_dtype).replace('torch.', '')}")
        parts += self.scoring.describe()
        parts += [f"departs from its spec: {d}" for d in self.departures]
        if self.beyond:
            parts.append(f"laws only: it takes {self.beyond}")
        if self.mixes_positions:
            parts.append(f"its step over positions reaches a position from a later one ({self.mixes_future})"
                         if self.mixes_future else "its step over positions reaches no position from a later one "
                         "(a probe of each projection)")
        fixed = [f"{n}={a}" for n, a in zip(("B", "Lq", "Lk"), self.axes, strict=True) if a is not None]
        if fixed:
            parts.append(f"fixed {', '.join(fixed)}")
        return "; ".join(parts + list(self.notes))


#: why a property about masks cannot apply to a target that takes none (its strategies return it)
NO_MASK = "the target's forward takes no mask"
#: how the reason of a property that needs keys apart from the queries begins, on a self-attention layer
SELF_ONLY = "self-attention only"
#: how a check against the oracle is n/a for a layer taking a step beyond it (``Conventions.beyond``)
LAWS_ONLY = "laws only"


def _subset(allowed: tuple[str, ...]) -> Callable[[object], frozenset[str]]:
    def parse(value: object) -> frozenset[str]:
        if not isinstance(value, (str, tuple, list, set, frozenset)):
            raise TypeError("expected a name or a collection of names")
        items = (value,) if isinstance(value, str) else tuple(value)
        bad = [v for v in items if v not in allowed]
        if bad:
            raise ValueError(f"expected a subset of {allowed}")
        return frozenset(items)
    return parse


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected True or False")
    return value


def _causal(value: object) -> bool | str:
    if not isinstance(value, (bool, str)):
        raise TypeError("expected True, False, 'top_left' or 'bottom_right'")
    return causal_alignment(value) or False


#: 4-D inputs taking a sequence as one row: where its batch B, its positions L and its features D go, the
#: fourth axis of size 1. Features last, (A0, A1, A2, D): SAM's image encoder (B, H, W, C) takes (B, 1, L, D),
#: "B1LD". Features second, a channels-first feature map (A0, D, A1, A2): vit-pytorch's NesT (B, C, H, W)
#: takes (B, D, 1, L), "BD1L".
GRID_LAYOUTS = ("B1LD", "BL1D", "1BLD", "1LBD", "L1BD", "LB1D", "BD1L", "BDL1", "1DBL", "1DLB", "LD1B", "LDB1")
#: the layouts of q, k, v and the output a target may take (Conventions.layout)
#: a sequence given channels first, (B, D, L): a layer whose projections are 1x1 ``Conv1d`` (1-D U-Nets' attention)
CHANNELS_FIRST = "BDL"
LAYOUTS = ("batch_first", "seq_first", CHANNELS_FIRST, *GRID_LAYOUTS)


def _choice(allowed: tuple[str, ...]) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {allowed}")
        return str(value)
    return parse


def _positive(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("expected a positive int")
    return value


def _names(value: object) -> tuple[str, ...]:
    """Distinct non-empty names, in order (the attention implementations a layer runs through)."""
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) and v for v in value) \
            or len(set(value)) != len(value):
        raise ValueError("expected a list of distinct names")
    return tuple(value)


def _positive_or_none(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("expected a positive int or None")
    return value


_OUTPUT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                  "float64": torch.float64}


def _output_dtype(value: object) -> torch.dtype | None:
    if value is None or (isinstance(value, torch.dtype) and value in _OUTPUT_DTYPES.values()):
        return value
    if not isinstance(value, str) or value not in _OUTPUT_DTYPES:
        raise ValueError(f"expected one of {tuple(_OUTPUT_DTYPES)} or None")
    return _OUTPUT_DTYPES[value]


def _scale(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError("expected a positive finite number or None")
    return float(value)


def _rotary(value: object) -> Rotary | None:
    if value is None or isinstance(value, Rotary):
        return value
    if not isinstance(value, Mapping):
        raise TypeError("expected None or a mapping of base, interleaved, fraction, reverse")
    unknown = set(value) - {"base", "interleaved", "fraction", "reverse"}
    if unknown:
        raise ValueError(f"unknown rotary keys {sorted(unknown)}; known: base, interleaved, fraction, reverse")
    base, interleaved, fraction, reverse = value.get("base", 10000.0), value.get("interleaved", False), \
        value.get("fraction", 1.0), value.get("reverse", False)
    if isinstance(base, bool) or not isinstance(base, (int, float)) or isinstance(fraction, bool) \
            or not isinstance(fraction, (int, float)) or not isinstance(interleaved, bool) \
            or not isinstance(reverse, bool):
        raise TypeError("expected base and fraction numbers, interleaved and reverse True or False")
    return Rotary(float(base), interleaved, float(fraction), reverse)


def _alibi(value: object) -> PositionBias | None:
    if isinstance(value, PositionBias):
        return value
    return PositionBias(alibi=True, source="declared") if _flag(value) else None


_DECLARABLE: dict[str, tuple[str, Callable[[object], object]]] = {
    "mask": ("mask", _subset(("bool", "float"))),
    "mask_forms": ("mask_forms", _subset(MASK_FORMS)),
    "cross_attention": ("cross_attention", _flag),
    "self_attention": ("cross_attention", lambda v: not _flag(v)),
    "kv_shared": ("kv_shared", _flag),
    "weights": ("weights", _flag),
    "fully_masked": ("fully_masked", _choice(FULLY_MASKED)),
    "causal": ("causal", _causal),
    "grads": ("grads", _flag),
    "dropout": ("dropout", _flag),
    "kv_heads": ("kv_heads", _positive_or_none),
    "kv_map": ("kv_map", _choice(KV_MAPS)),
    "layout": ("layout", _choice(LAYOUTS)),
    "output_dtype": ("output_dtype", _output_dtype),
    "scale": ("scale", _scale),
    "rotary": ("rotary", _rotary),
    "softcap": ("softcap", _scale),
    "window": ("window", _positive_or_none),
    "max_length": ("max_length", _positive_or_none),
    "head_dim_multiple": ("head_dim_multiple", _positive),
    "alibi": ("position_bias", _alibi),
    "implementations": ("implementations", _names),
}


class Instance(Protocol):
    """One built target at fixed sizes and weights: what a property calls.

    ``params()`` are its projection weights in nn.Linear's (out, in) layout, the oracle's
    input; where they are the target's own tensors, editing them in place edits the target
    (head isolation relies on it, on a ``fresh`` instance).
    """

    @property
    def d_model(self) -> int: ...

    @property
    def n_head(self) -> int: ...

    @property
    def conventions(self) -> Conventions: ...

    def params(self) -> MHAParams: ...

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, Lq, D), k (B, Lk, D), v (B, Lk, D), our mask convention -> (B, Lq, D)."""
        ...

    def with_weights(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``__call__``, also returning the weights (B, H, Lq, Lk); NotApplicable if it cannot."""
        ...

    def set_dropout(self, p: float) -> bool:
        """Set every dropout probability to ``p``; False if the target has none it can set."""
        ...

    def set_training(self, mode: bool) -> None:
        """Training mode on or off (eval); a no-op where torch's modes do not reach the target."""
        ...

    def cached(self, x: torch.Tensor, chunks: tuple[int, ...]) -> torch.Tensor:
        """Self-attention over x (B, L, D) run through the target's own KV cache in ``chunks`` (sizes
        summing to L: a prefill, then decode steps or chunks), each chunk called with the cache the
        earlier ones filled and the causal mask aligned bottom-right; the outputs concatenated (B, L, D).
        NotApplicable where the target takes no cache (``conventions.kv_cache`` None)."""
        ...

    def fresh(self) -> Instance:
        """A new, independent instance as this one was built: the same weights, no state from
        earlier calls (editing one's weights leaves the other's alone)."""
        ...


class Subject(Protocol):
    """Something to verify: builds instances at the sizes a property draws.

    ``spec`` names it in reports and example-database keys; ``probe_sizes`` is a size it can
    always be built at (its fixed sizes, for an exported model), where the runner reads its
    conventions before a property runs.
    """

    @property
    def spec(self) -> str: ...

    @property
    def probe_sizes(self) -> tuple[int, int]: ...

    def build(self, d_model: int, n_head: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Instance:
        """An instance at (d_model, n_head), weights drawn from ``seed`` where the target's are not
        fixed, computing in ``dtype`` where it can; TargetError if it cannot be built."""
        ...


__all__ = ["Conventions", "Instance", "NotApplicable", "Subject", "TargetError"]
