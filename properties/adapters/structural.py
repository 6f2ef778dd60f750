"""Zero-config adapters: layers recognized by the names of their projections, as the libraries
write them, and called by the names in their ``forward`` signature (``adapters.signature``).

=====================  ========================================================================
adapter                recognizes
=====================  ========================================================================
``fused_qkv``          ``qkv`` + ``proj`` (timm), ``c_attn`` + ``c_proj`` (nanoGPT; GPT-2 with
                       HF's ``Conv1D``, whose weight is (in, out) and is transposed here)
``separate_qkv``       ``q_proj/k_proj/v_proj`` + ``o_proj``/``out_proj``/``output_proj`` (HF
                       Llama, Mistral, BART, Whisper; fairseq; torchtune), ``to_q/to_k/to_v`` +
                       ``to_out`` (x-transformers); grouped-query and multi-query attention
                       (fewer key/value rows: kv heads are read from the weights' shapes)
``qkv_no_output``      ``query/key/value`` with no output projection (HF BERT self-attention)
``by_shape``           last: the projections the forward names, read by their shapes
                       (``properties.adapters.by_shape``: whisper, perceiver, vit-pytorch)
=====================  ========================================================================

What a known library means by its mask is written here, once, per library (never inferred
from outputs, which would turn a polarity bug into a "convention"):

* transformers: the layer gets the mask the model would build: a bool keep-mask for
  ``sdpa``, an additive mask with ``finfo(dtype).min`` for ``eager`` (so a fully masked row
  gets uniform weights, declared "uniform"); a causal layer always gets its causal mask
  explicitly, as the model gives it (HF's eager path does not apply causality by itself).
  Llama-style layers get ``position_embeddings`` from the library's own rotary embedding class
  for positions 0 .. L-1, and the oracle applies the rotary their config describes
  (``adapters.rotary_reading.rotary_of``): the layer's rotary is verified. A rope type other than the
  default formula gets a rotation by 0, said in the conventions' notes. Layers with a
  ``position_bias`` (T5) get the mask row of their implementation with a position bias.
* diffusers: ``attention_mask`` additive (B, Lq, Lk); keys and values through
  ``encoder_hidden_states``.
* torchtune: ``mask`` is a bool keep-mask (B, Lq, Lk) that *replaces* causality, so a causal
  layer gets keep AND causal.
* x-transformers: ``attn_mask``, a bool keep-mask; keys and values through ``context``.
* timm and any layer we do not know: SDPA's convention (bool True = keep, float additive).

A layer's ``mha_verify_conventions`` class attribute overrides any of these (checked keys).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
import textwrap
import weakref

import torch
from torch import nn

from mha_verify.mha.reference import MHAParams
from mha_verify.mha.scoring import Norm, PositionBias
from mha_verify.properties.adapters import recognition
from mha_verify.properties.adapters.base import Adapter, declared_conventions
from mha_verify.properties.adapters.bias_tables import GatheredBias, read_gathered_bias, table_parameters
from mha_verify.properties.adapters.context_probe import context_refused
from mha_verify.properties.adapters.forward_source import (
    causal_buffer_length,
    detect_causal,
    forward_sources,
    own_causal_mask,
)
from mha_verify.properties.adapters.head_count import n_head_of
from mha_verify.properties.adapters.kv_cache import cache_argument, run_chunks
from mha_verify.properties.adapters.layer_attrs import (
    SCALE_ATTRS,
    has_dropout,
    layer_position_bias,
    layer_scale,
    layer_softcap,
    layer_type_of,
    returns_weights,
    set_all_dropout,
)
from mha_verify.properties.adapters.layout_probe import from_layer, read_layout, to_layer
from mha_verify.properties.adapters.library_facts import (
    KNOWN_LIBRARIES,
    LAWFUL_OPERATORS,
    always_masked,
    argument_ignored,
    argument_unread,
    library_format,
    library_of,
    mask_switch,
    mask_unsupported,
    other_operator,
    rows_unspecified,
    takes_points,
)
from mha_verify.properties.adapters.mask_reading import read_shift
from mha_verify.properties.adapters.position_steps import convolved_projections, describe, reaches_back
from mha_verify.properties.adapters.qk_norm import PreNorms, input_norms, norm_departures, qk_norms
from mha_verify.properties.adapters.rotary_reading import (
    cos_sin_batched,
    library_rotary,
    position_embeddings,
    rotary_layout,
    rotary_of,
    scaled_rope,
)
from mha_verify.properties.adapters.signature import first_output, is_same_input, read_signature
from mha_verify.properties.adapters.spec import (
    causal_departure,
    declared_causal,
    declared_dropout,
    declared_reverse,
    declared_scale,
    rotary_departure,
    scale_departure,
)
from mha_verify.properties.adapters.unmodelled import BEYOND, convolutions_over_positions, describe_steps, residual
from mha_verify.properties.protocol import GRID_LAYOUTS, Conventions, NotApplicable

#: a forward (or processor) that joins the context to the input as one sequence: joint attention
_JOINT = re.compile(r"cat\(\s*[\[(]\s*(hidden_states\s*,\s*encoder_hidden_states"
                    r"|encoder_hidden_states\s*,\s*hidden_states)\b")


#: a forward that scales its queries by 1/sqrt(Hd) itself (ESM's ``query_layer * self.attention_head_size**-0.5``)
#: a forward that scales its scores somehow (an attribute, a square root, a power, SDPA's own default)
_SCALES = re.compile(r"scal|sqrt|\*\*\s*\(?\s*-|temperature|scaled_dot_product_attention|flex_attention|/\s*math")
#: a number literal given to SDPA as its scale
_SDPA_SCALE = re.compile(r"scaled_dot_product_attention\((?:[^()]|\([^()]*\))*?"
                         r"\bscale\s*=\s*(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_QUERY_PRESCALED = re.compile(r"query\w*\s*=\s*query\w*\s*\*\s*self\.\w+\s*\*\*\s*-0\.5")


def _pre_norm_note(pre: PreNorms, context: str | None) -> str:
    """The conventions line of a pre-norm read by :func:`qk_norm.input_norms`."""
    norm, context_norm, names, self_only = pre
    if self_only:
        context = None
    what = norm.describe().replace(" over all heads", " over D")
    if context is None:
        return f"its input normalized first by {names} ({what}), applied by the oracle"
    if context_norm is None:
        return (f"its queries' input normalized first by {names} ({what}), its {context} projected as given "
                "(the normalized input only where it is absent), applied by the oracle")
    return (f"its queries' input and its {context} normalized first by {names} ({what}; "
            f"{context_norm.describe().replace(' over all heads', ' over D')}), applied by the oracle")


#: a child computing positions of its own: rotary embeddings, positional encodings
_POSITIONAL = re.compile(r"rotary|rope|positional|posemb|pos_?enc", re.IGNORECASE)


def _gathered_bias(module: nn.Module) -> GatheredBias | None:
    """The relative-position bias a self-attention layer gathers from a table of its own, where its
    tensors and its forward's source say one (:mod:`bias_tables`)."""
    try:
        heads = n_head_of(module)
    except NotApplicable:
        return None
    return read_gathered_bias(module, heads, "\n".join(text for _, text in forward_sources(module)))


def _own_positional(module: nn.Module) -> str:
    """The rotary or positional embeddings a layer of a library the harness has no facts about computes
    with children of its own that its forward calls (``self.query_rotary_pe(query)``), in words; ""
    where it has none."""
    if library_of(module) in {library for library, _ in recognition.LIBRARY_FORMATS}:
        return ""
    text = "\n".join(source for _, source in forward_sources(module))
    found = [f"{name}: {type(child).__name__}" for name, child in module.named_children()
             if _POSITIONAL.search(type(child).__name__) and re.search(rf"\bself\.{re.escape(name)}\(", text)]
    found += _rotary_calls(forward_sources(module)[0][1])
    return f"a rotary or positional embedding of its own ({', '.join(found)})" if found else ""


#: a function named for a rotation (speechbrain's ``q_rotated = _rope_rotate(query)``)
_ROTARY_NAME = re.compile(r"rope|rotary", re.IGNORECASE)


def _rotary_calls(forward: str) -> list[str]:
    """The functions named for a rotation that ``forward`` (its source) calls unconditionally: in a statement
    of its body itself, not under an ``if`` (a rotary the caller may pass, a path the instance never takes)."""
    try:
        tree = ast.parse(textwrap.dedent(forward))
    except SyntaxError:
        return []
    function = tree.body[0] if tree.body else None
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    found = [node.func.id for statement in function.body if not isinstance(statement, (ast.If, ast.For, ast.While,
                                                                                        ast.With, ast.Try))
             for node in ast.walk(statement)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and _ROTARY_NAME.search(node.func.id)]
    return [f"{name}()" for name in dict.fromkeys(found)]


class StructuralAdapter(Adapter):
    """Calls a layer by the names of its forward's parameters and its library's mask format.

    Subclasses say which projections they recognize (``matches``, ``params``).
    """

    def conventions(self, module: nn.Module) -> Conventions:
        # steps beyond the attention the oracle models, under which the laws still hold: the layer is
        # verified by the laws alone, each step named (judged against the oracle, it would fail every
        # check, and each failure would say nothing of the step)
        beyond: list[str] = []
        positional = False
        other = other_operator(module)
        if other in LAWFUL_OPERATORS:  # cosine-similarity or linear attention
            beyond.append(f"a scoring of its own (its forward {other})")
        elif other:  # an FFT, a random sample of keys: not even the laws of attention are its laws
            raise ValueError(f"{type(module).__name__}'s forward {other}, so it cannot be verified as attention")
        q_norm, k_norm, v_norm = self._norms(module)
        learned = [a for a in SCALE_ATTRS if isinstance(getattr(module, a, None), nn.Parameter)]
        if learned:  # TimesFM: softplus(scaling) per query dimension
            beyond.append(f"a learned scale of its queries ({learned[0]})")
        p = self.params(module)
        if p.w_o is not None and p.w_q.shape[0] != p.w_o.shape[1]:  # Qwen3-Next: q_proj gives q and a gate
            beyond.append(f"an output gate from its query projection ({p.w_q.shape[0]} features, where its output "
                          f"projection takes {p.w_o.shape[1]})")
        position_bias = layer_position_bias(module)
        sig = read_signature(module)
        source = forward_sources(module)[0][1]
        gathered = None if position_bias is not None or sig.key is not None else _gathered_bias(module)
        if gathered is not None:  # MONAI's Swin windows: its table added as its index says, lengths up to N
            position_bias = gathered.position_bias(module)
        try:
            pre = input_norms(module, source, sig.input, sig.context) \
                if sig.key is None else None  # a pre-norm of the layer's input (and its context)
        except ValueError:
            if not beyond:
                raise
            # a norm the oracle cannot apply, of a layer held by the laws alone anyway (simple-diffusion's
            # linear attention normalizes over its channels): named below as a step, with the others
            pre = None
        # LookViT's: a context only where built for cross-attention (where its source does not say so already):
        # verified as self-attention, its input's norm read as such
        refused = self._context_refused(module, sig.input, sig.context) if sig.context is not None \
            and library_of(module) != "torchtune" and not (pre is not None and pre.self_only) else ""
        if refused and sig.key is None:
            pre = input_norms(module, source, sig.input, None)
        pre_norm, context_norm = (None, None) if pre is None else (pre.norm, pre.context_norm)
        every = [name for name in self._unmodelled(module, (q_norm, k_norm, v_norm, pre_norm, context_norm),
                                                   position_bias, gathered) if name not in learned]  # named above
        convolved_by = convolved_projections(module)
        mixes, future = None, None
        if convolved_by:  # Primer-EZ: each projection's convolution over positions, held by the laws alone
            steps = {id(t) for child in convolved_by.values() for part in list(child)[1:] for t in part.parameters()}
            params = dict(module.named_parameters())
            every = [name for name in every if id(params[name]) not in steps]
            mixes = describe(convolved_by)
            beyond.append(mixes)
            positional = True
            future = next((f"{name}: {seen}" for name, child in convolved_by.items()
                           if (seen := reaches_back(child)) is not None), None)
        convolved = convolutions_over_positions(module, every)
        if convolved:  # a masked position leaks into its neighbours through it: not even the mask laws hold
            raise ValueError(f"{type(module).__name__} takes a convolution over positions ({', '.join(convolved)}), "
                             f"{BEYOND} (a masked position reaches its neighbours through it)")
        extra = every[:4]
        if extra:  # nGPT's learned query scale, a gate (Dory), talking heads, a relative-position table
            try:
                heads: int | None = n_head_of(module)
            except NotApplicable:
                heads = None
            words, moves = describe_steps(module, extra, heads)
            beyond.append(words)
            positional = positional or moves
        kept = residual(forward_sources(module)[0][1], sig.input)
        if kept:  # labml's retro attention adds its input back: x + attention(x)
            beyond.append(f"its input added back to its output (a residual: `{kept}`)")
        own = "" if sig.rotary else _own_positional(module)
        if own:  # labml's query_rotary_pe: a rotation the oracle does not read
            beyond.append(own)
            positional = True
        if beyond and library_of(module) in KNOWN_LIBRARIES:
            # its models call it with what the harness does not supply (dynamic masks, relative embeddings, a
            # cache's positions): held by the laws alone, 3 of 26 transformers classes failed through such calls
            # (WavLM's key padding, Doge's dynamic mask), not triaged; such a layer stays refused, naming the step
            raise ValueError(f"{type(module).__name__} takes a step beyond the attention the oracle models: "
                             f"{', '.join(beyond)}, so it cannot be verified yet (in {library_of(module)}, a layer "
                             "taking such a step is refused rather than held by the laws alone)")
        fmt, fully_masked, note = library_format(module)
        causal, how = detect_causal(module)
        departures: list[str] = []
        causal_spec = declared_causal(module)
        not_causal = None if causal_spec is None else causal_departure(causal, how, causal_spec)
        if not_causal is not None and causal_spec is not None:  # held causal, as its library declares
            departures.append(not_causal)
            causal, how = True, causal_spec.how
        if fully_masked == "uniform" and causal and own_causal_mask(module):
            # ImageGPT's where(causal, scores, finfo.min) plus a finfo.min mask: -inf on future keys
            fully_masked = "uniform_visible"
        ignored = (argument_ignored(module, sig.mask) or mask_switch(module, sig.mask)) if sig.mask is not None \
            else None
        # a mask its own source says it does not use (PP-OCR's image recognizers): called without
        # one; the mask properties are n/a with that kind, quoting the line
        unsupported = mask_unsupported(module, sig.mask) if sig.mask is not None and ignored is None else None
        has_mask = sig.mask is not None and ignored is None and unsupported is None
        # keys = values through one argument (``key_value_states``, ``encoder_hidden_states``):
        # cross-attention drawn with k = v; torchtune's ``y`` is verified as self-attention
        shared = sig.context is not None and library_of(module) != "torchtune"
        unread = argument_unread(module, sig.context) if shared and sig.context is not None else None
        context_ignored = None if unread is None else f"{sig.context} is accepted and not used: {unread}"
        if context_ignored is not None:  # ErnieImage's single stream: verified as the self-attention it computes
            shared = False
        joint_note = ""
        if shared and pre is not None and pre.self_only:  # XCiT's join; a context norm not built
            shared, joint_note = False, pre.self_only
        if shared and refused:
            shared, joint_note = False, refused
        if shared and any(_JOINT.search(source) for _, source in forward_sources(module)):
            # joint attention (MotifVideo, SD3's kind): the context joins the sequence, it is not keys
            shared, joint_note = False, (f"joint attention: {sig.context} is concatenated to {sig.input} "
                                         "(one sequence), verified as self-attention")
        if not shared and pre_norm is not None:  # verified as self-attention: keys and values are the normalized input
            context_norm = pre_norm
        scale, scale_how, departure = self._held_scale(module)
        departures += [departure] if departure else []
        departures += norm_departures(module)
        rotary, rotary_how = rotary_of(getattr(module, "config", None), layer_type_of(module)) \
            if sig.rotary else (None, "")
        embedding = getattr(module, "position_embedding_type", None)
        if rotary is not None and isinstance(embedding, str) and embedding != "rotary":
            # ESM's: the forward takes position_embeddings and uses them only for "rotary"
            rotary, rotary_how = None, f"no rotary: its position_embedding_type is {embedding!r}"
        scaled = scaled_rope(module) if rotary is None and sig.rotary and not (
            isinstance(embedding, str) and embedding != "rotary") else None
        if scaled is not None:
            # its model's rotary class gives the layer its real (cos, sin); the oracle's formula is the default
            # one only: held by the laws alone, its rotary still running (its layout matters to the oracle only)
            rotary, rope_type = scaled
            rotary_how = f"rotary of rope type {rope_type!r}, its (cos, sin) from its library's rotary class"
            beyond.append(f"a rotary of rope type {rope_type!r} (its library's rotary class gives the angles; the "
                          "oracle computes the default formula only)")
        if sig.rotary:
            cos_sin_batched(module)  # read now, before an exporter traces a call
        if rotary is not None and scaled is None:
            layout, layout_how = rotary_layout(module, rotary.base)
            if layout is None and library_rotary(module) is not None:
                # its own functions and its library's angles run; the oracle knows none of its formulas: held by
                # the laws alone, its step never switched off
                rotary_how = f"its rotary, from its library's rotary class: {layout_how}"
                beyond.append(f"a rotary whose {layout_how.removeprefix('its ')}")
            elif layout is None:  # replaced by a rotation by 0 (cos 1, sin 0): the rest is still verified
                rotary, rotary_how = None, f"rotary replaced by a rotation by 0: {layout_how}"
            else:
                rotary = dataclasses.replace(rotary, interleaved=layout[0], reverse=layout[1])
                rotary_how = f"{rotary.describe()} (its config; the layout from {layout_how})"
                direction = declared_reverse(module)
                turned = None if direction is None else rotary_departure(layout[1], layout_how, direction)
                if turned is not None and direction is not None:  # the oracle turns it as its library declares
                    departures.append(turned)
                    rotary = dataclasses.replace(rotary, reverse=direction[0])
                    rotary_how = f"{rotary.describe()} (its config; the direction its library declares)"
        window = getattr(getattr(module, "config", None), "sliding_window", None)
        # HF applies a sliding window through the mask its model builds (sdpa, eager), not in the
        # layer: the layer alone is full (causal) attention, and the report says so
        window_note = (f"sliding window {window} in its config: not applied (HF builds it into the model's mask); "
                       "checked as full attention") if isinstance(window, int) and window > 0 else ""
        softcap, softcap_how = layer_softcap(module)
        buffer = causal_buffer_length(module) if causal else None
        takes_kv = (sig.key is not None and sig.value is not None) or shared
        longest = [n for n in (None if buffer is None else buffer[0], None if gathered is None else gathered.length)
                   if n is not None]
        # BEATs' stable softmax: the row's max over every key, masked ones too, subtracted before the mask
        shifted = read_shift(forward_sources(module), sig.mask) if has_mask and sig.mask is not None else None
        found = Conventions(
            mask=fmt.takes if has_mask else frozenset(),
            mask_forms=fmt.forms if has_mask else Conventions().mask_forms,
            mask_lengths=has_mask and fmt.layout == "LEN",
            cross_attention=takes_kv and not positional and (not causal or causal == "bottom_right"),
            kv_shared=shared and sig.key is None,
            weights=returns_weights(module),
            fully_masked=fully_masked,
            rows_unspecified=rows_unspecified(module) if has_mask else None,
            mask_ignored=None if ignored is None else f"{sig.mask} is accepted and not used: {ignored}",
            mask_unsupported=None if unsupported is None else f"{sig.mask}: {unsupported}",
            context_ignored=context_ignored,
            shifted_scores=shifted,
            causal=causal,
            dropout=has_dropout(module),
            dropout_declared=declared_dropout(module),
            kv_cache="hf_cache" if cache_argument(module) else None,
            # transformers runs a layer built for sdpa through its eager code too (output_attentions, or asked)
            implementations=("sdpa", "eager") if getattr(getattr(module, "config", None), "_attn_implementation",
                                                         None) == "sdpa" else (),
            scale=scale,
            departures=tuple(departures),
            rotary=rotary,
            # its rotary code still runs, on pairs of columns (LightGlue's stacks x[..., ::2] with
            # x[..., 1::2]): where the rotation is by 0, head widths stay even
            # a rotary of its own rotates pairs of columns too: RoPE has no odd head width (labml's retro
            # rotary at Hd = 3 raised on every call)
            head_dim_multiple=2 if (sig.rotary and rotary is None) or own or sig.tables else 1,
            beyond=", ".join(beyond) or None,
            beyond_positional=positional,
            mixes_positions=mixes,
            mixes_future=future,
            q_norm=q_norm,
            k_norm=k_norm,
            v_norm=v_norm,
            input_norm=pre_norm,
            context_norm=context_norm,
            softcap=softcap,
            position_bias=position_bias,
            max_length=min(longest) if longest else None,
            notes=(f"adapter {self.name}", *(n for n in (self.reading_note(module),) if n), how,
                   *(() if buffer is None else (f"lengths up to {buffer[0]}: {buffer[1]} is sliced to the "
                                                "sequence, so it takes no longer one",)),
                   *(() if gathered is None else (f"lengths up to {gathered.length}: its index {gathered.index} "
                                                  f"has an entry for no later position",)),
                   *(() if shifted is None else (f"scores shifted by their row's max over every key before the mask "
                                                 f"(`{shifted}`): a masked key reaches the output through rounding",)),
                   *(n for n in ("" if pre is None else _pre_norm_note(pre, None if refused else sig.context),
                                 scale_how, rotary_how, softcap_how, window_note, joint_note, context_ignored or "",
                                 always_masked(module) if has_mask else "") if n),
                   (note + "; " + fmt.describe()) if has_mask else f"forward({sig.input}) takes no mask"
                   + ("" if ignored is None else f" it uses ({sig.mask}: {ignored})"),
                   *((f"forward's {', '.join(given_none(module))} (required, no role the harness reads) "
                      "given None",) if given_none(module) else ()),
                   *((f"forward's {', '.join(sig.tables)} (a rotary's tables, required) given a rotation by 0 (cos 1, "
                      f"sin 0) of (L, {table_width(module, head_dim_of(module, p))}): no rotary is verified, the rest "
                      "is",) if sig.tables else ()),
                   *((f"forward's {sig.positions} given 0 .. L - 1 for every item",) if given_positions(module)
                     else ())),
        )
        if takes_kv and positional:
            # where its positional step places query i among Lk != Lq keys is its own convention, unread
            found = dataclasses.replace(found, notes=(
                *found.notes, "drawn as self-attention (q = k = v): its positional step of its own places queries "
                              "among keys in a way the harness does not read"))
        io_layout, io_layout_how = self._layout(module)
        if io_layout in GRID_LAYOUTS and found.mask:  # where a mask goes in a 4-D layout is not read
            found = dataclasses.replace(found, mask=frozenset(), notes=(
                *found.notes, f"its mask ({sig.mask}) not given: how it lays out a mask over 4-D inputs is not read"))
        if io_layout != "batch_first":
            found = dataclasses.replace(found, layout=io_layout, notes=(*found.notes, io_layout_how))
        if self.mha_verify_conventions:  # a user's subclass of a reading adapter declares what it knows
            found = found.declare(self.mha_verify_conventions, source=f"{type(self).__name__}.mha_verify_conventions")
        conv = declared_conventions(module, found)
        declared = dict(getattr(module, "mha_verify_conventions", None) or {})
        if takes_kv and not conv.cross_attention and isinstance(declared.get("causal"), str) \
                and not {"cross_attention", "self_attention"} & set(declared):
            # a causal layer is drawn as self-attention (a decoder's, Lq = Lk), where the two alignments
            # agree; one that declares its alignment ("top_left", "bottom_right") says Lq != Lk matters
            # (a decode step, a chunked prefill): drawn with keys and values of their own
            conv = dataclasses.replace(conv, cross_attention=True)
        return conv

    def reading_note(self, module: nn.Module) -> str:
        """How the projections were read, where names did not say it ("": by their names)."""
        return ""

    def _unmodelled(self, module: nn.Module, norms: tuple[Norm | None, ...], bias: PositionBias | None,
                    gathered: GatheredBias | None = None) -> list[str]:
        """The names of ``module``'s parameters that neither the projections, the QK-norm nor the
        position-bias table account for."""
        used = self.sources(module)
        used += [t for n in norms if n is not None for t in (n.weight, n.bias) if t is not None]
        table = getattr(module, "relative_attention_bias", None)
        if bias is not None and isinstance(table, nn.Module):
            used += list(table.parameters())
        if gathered is not None:
            used += table_parameters(module, gathered)
        known = {id(t if t._base is None else t._base) for t in used}
        return [name for name, p in module.named_parameters() if id(p) not in known]

    def sources(self, module: nn.Module) -> list[torch.Tensor]:
        """The layer's own tensors that :meth:`params` reads (views of them, or copies for a fused layout)."""
        return [t for t in self.params(module) if t is not None]

    def _norms(self, module: nn.Module) -> tuple[Norm | None, Norm | None, Norm | None]:
        """The layer's QK-norm (:func:`qk_norm.qk_norms`); ValueError for one the oracle cannot apply."""
        if not any(isinstance(getattr(module, n, None), nn.Module)
                   for n in (*(n for pair in recognition.QK_NORM_PAIRS for n in pair), *recognition.V_NORMS)):
            return None, None, None
        p = self.params(module)
        head_dim = head_dim_of(module, p)
        return qk_norms(module, p.w_q.shape[0] // head_dim, head_dim, p.w_k.shape[0] // head_dim)

    def _held_scale(self, module: nn.Module) -> tuple[float | None, str, str | None]:
        """(the scale the oracle applies, how we know, the departure of the layer's code from it or None).

        Where the layer's library declares its scale (:func:`adapters.spec.declared_scale`), that is the
        scale, and a scale read from the code that is not it is a departure; elsewhere the code's reading
        is the layer's convention."""
        try:
            head_dim = head_dim_of(module, self.params(module))
        except NotApplicable:
            return None, "", None
        if head_dim <= 0:
            return None, "", None
        scale, how = self._scale(module, head_dim)
        declared = declared_scale(module, head_dim)
        if declared is None:
            return scale, how, None
        departure = scale_departure(scale, how, declared, head_dim)
        if departure is None:
            return scale, how, None
        value = None if math.isclose(declared.value, head_dim ** -0.5, rel_tol=1e-6) else declared.value
        return value, f"softmax scale {declared.how}", departure

    def _scale(self, module: nn.Module, head_dim: int) -> tuple[float | None, str]:
        """The softmax scale the layer's code states (:func:`adapters.layer_attrs.layer_scale`), at its head
        width ``head_dim``."""
        scale, how = layer_scale(module, head_dim)
        if scale is None and library_of(module) not in {library for library, _ in recognition.LIBRARY_FORMATS}:
            stated = next((hit for _, source in forward_sources(module) if (hit := _SDPA_SCALE.search(source))), None)
            if stated is not None:  # na-vit's ``scaled_dot_product_attention(..., scale = 1.)``
                value = float(stated.group(1))
                if math.isclose(value, head_dim ** -0.5, rel_tol=1e-6):
                    return None, ""
                return value, f"softmax scale {value:g} from its source (`{stated.group(0)[-24:].strip()}`)"
        if scale is None and self._gain_is_the_temperature(module):
            return 1.0, ("no softmax scale: its forward multiplies q k^T by none, and its QK-norm's learned "
                         "gain sets the temperature (read from its source)")
        if scale is not None and any(_QUERY_PRESCALED.search(source) for _, source in forward_sources(module)):
            # ESM's: scaling = 1.0 "for BC", the queries multiplied by head_size ** -0.5 in the forward
            scale = scale * head_dim ** -0.5
            if math.isclose(scale, head_dim ** -0.5, rel_tol=1e-6):
                return None, ""
            how += ", times the head_size ** -0.5 its forward multiplies the queries by"
        return scale, how

    @staticmethod
    def _gain_is_the_temperature(module: nn.Module) -> bool:
        """A layer of a library the harness has no facts about whose source scales the scores nowhere and
        which normalizes q and k with a learned gain (vit-pytorch's qk-norm ViTs: ``dots = q @ k^T``,
        the gain drawn as 1/sqrt(Hd)): its scale is 1, a choice. Without a QK-norm a missing scale stays
        the textbook bug it is."""
        if library_of(module) in {library for library, _ in recognition.LIBRARY_FORMATS}:
            return False
        gains = [getattr(module, n, None) for pair in recognition.QK_NORM_PAIRS for n in pair]
        if sum(isinstance(g, nn.Module) and any(True for _ in g.parameters()) for g in gains) < 2:
            return False
        sources = [source for _, source in forward_sources(module) if source]
        return bool(sources) and not any(_SCALES.search(source) for source in sources)

    def _layout(self, module: nn.Module) -> tuple[str, str]:
        """The layer's layout, probed where its library does not fix it (those the harness knows are
        batch-first) and its forward takes x alone (no rotary tables to pass); a position bias it takes
        and computes where none is given (speechbrain's BEATs layer, sequence-first) does not stop it."""
        sig = read_signature(module)
        if {library for library, _ in recognition.LIBRARY_FORMATS} & {library_of(module)} or sig.rotary \
                or cache_argument(module):
            return "batch_first", ""

        def run(x: torch.Tensor) -> torch.Tensor:
            kwargs: dict[str, object] = {sig.input: x}
            if sig.key is not None and sig.value is not None:
                kwargs[sig.key] = kwargs[sig.value] = x
            if sig.mask is not None and sig.mask_required:
                kwargs[sig.mask] = None
            kwargs.update(dict.fromkeys(given_none(module)))
            # forward itself, not the module's __call__: a probe is no call of the check's, and a hook
            # recording the check's calls (a replay bundle, the precision reading) must not see it
            return first_output(module.forward(**kwargs))

        p = self.params(module)
        return read_layout(module, run, p.w_q.shape[1], p.w_q.dtype)

    def _context_refused(self, module: nn.Module, input_name: str, context: str) -> str:
        """:func:`context_probe.context_refused` with the layer's own call on x (2, 3, D) in its layout."""
        p = self.params(module)
        layout = self._layout(module)[0]

        def run(with_context: bool) -> object:
            x = torch.randn(2, 3, p.w_q.shape[1], generator=torch.Generator().manual_seed(0),
                            dtype=torch.float64).to(p.w_q.dtype)
            x = to_layer(x, layout)
            kwargs: dict[str, object] = {input_name: x, **dict.fromkeys(given_none(module))}
            if with_context:
                kwargs[context] = x
            return module.forward(**kwargs)  # not __call__: no hook of a check's sees a probe

        return context_refused(module, context, input_name, run)

    @staticmethod
    def _in_layout(conv: Conventions, kwargs: dict[str, object], sig_names: tuple[str | None, ...]) -> None:
        """q, k, v (B, L, D) in ``kwargs`` in the layer's layout (:func:`layout_probe.to_layer`): (L, B, D)
        for a sequence-first layer, one row of a 4-D input for a grid one (one tensor stays one)."""
        if conv.layout == "batch_first":
            return
        seen: dict[int, torch.Tensor] = {}
        for name in (n for n in sig_names if n is not None):
            t = kwargs.get(name)
            if isinstance(t, torch.Tensor) and t.dim() == 3:
                kwargs[name] = seen.setdefault(id(t), to_layer(t, conv.layout))

    def call(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: torch.Tensor | None) -> torch.Tensor:
        out = from_layer(first_output(module(**self._points(module, self._kwargs(module, q, k, v, mask)))),
                         self.conventions(module).layout)  # -> (B, L, D)
        return out[:, 0] if takes_points(module) else out

    def call_with_weights(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """HF eager layers return (output, weights (B, H, Lq, Lk)); sdpa ones (output, None); T5's
        family (output, position_bias, weights)."""
        if not self.conventions(module).weights:
            raise NotApplicable(f"{type(module).__name__} returns no attention weights here")
        out = module(**self._points(module, self._kwargs(module, q, k, v, mask)))
        at = 2 if read_signature(module).position_bias is not None else 1
        if not (isinstance(out, tuple) and len(out) > at and isinstance(out[at], torch.Tensor)):
            raise NotApplicable("the target's forward returned no attention weights")
        first = from_layer(out[0], self.conventions(module).layout)
        return (first[:, 0] if takes_points(module) else first), out[at]  # weights (B * 1, H, Lq, Lk)

    @staticmethod
    def _points(module: nn.Module, kwargs: dict[str, object]) -> dict[str, object]:
        """``kwargs`` with q, k and v (B, L, D) as (B, 1, L, D) for a layer that takes a second batch
        axis (SAM's point batch), the same tensor for the same input (an exporter sees self-attention)."""
        if not takes_points(module):
            return kwargs
        sig = read_signature(module)
        seen: dict[int, torch.Tensor] = {}
        for name in (n for n in (sig.input, sig.key, sig.value, sig.context) if n is not None):
            t = kwargs.get(name)
            if isinstance(t, torch.Tensor) and t.dim() == 3:
                kwargs[name] = seen.setdefault(id(t), t[:, None])
        return kwargs

    @staticmethod
    def _unmasked_call(module: nn.Module, mask: torch.Tensor | None, Lq: int, Lk: int) -> bool:
        """Whether this call is made with no mask, as the layer's model makes it: a batch without padding
        (no mask drawn), Lq = Lk, for a layer whose library declares it causal and whose model then passes
        none (:class:`adapters.spec.DeclaredCausal`), its own causal flag deciding. Never while an exporter
        traces the call (transformers then passes the mask too)."""
        if mask is not None or Lq != Lk or torch.compiler.is_exporting() or torch.jit.is_tracing():
            return False
        spec = declared_causal(module)
        return spec is not None and spec.unmasked

    def _kwargs(self, module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> dict[str, object]:
        """The layer's forward arguments by name for one call in our convention."""
        sig = read_signature(module)
        conv = self.conventions(module)
        fmt = library_format(module)[0]
        if mask is not None and not conv.mask:
            raise NotApplicable("the target's forward takes no mask")
        kwargs: dict[str, object] = {sig.input: q, **dict.fromkeys(given_none(module))}
        # identity first: no torch.equal (data-dependent) while an exporter traces a self-attention call
        if sig.key is not None and sig.value is not None:
            if not conv.cross_attention and not is_same_input(q, k, v):
                raise NotApplicable(f"the target is self-attention only here (causal): forward({sig.input})")
            kwargs[sig.key], kwargs[sig.value] = k, v
        elif sig.context is not None and library_of(module) == "torchtune":
            if not (q is k and k is v) and not is_same_input(q, k, v):
                raise NotApplicable(f"the target is verified as self-attention: forward({sig.input}, {sig.context}=x)")
            kwargs[sig.context] = k  # torchtune's forward requires y, = x for self-attention
        elif sig.context is not None and conv.kv_shared and conv.cross_attention:
            # keys = values always through their argument, q = k = v included: a cross-attention-only
            # layer (BertCrossAttention) requires it, and for the others it is the self-attention call
            if k is not v and not bool(torch.equal(k, v)):
                raise NotApplicable(f"the target takes keys = values ({sig.context}): k and v differ")
            kwargs[sig.context] = k
        elif not (q is k and k is v) and not is_same_input(q, k, v):
            raise NotApplicable(f"the target is self-attention only: forward({sig.input})")
        if sig.mask is not None:
            B, Lq, Lk = q.shape[0], q.shape[1], k.shape[1]
            # a causal layer always gets its causal mask explicitly (ANDed with ours): HF eager and
            # torchtune apply only the mask they are given, and the AND is harmless for the others
            explicit_causal = conv.causal
            heads = q.shape[-1] // head_dim_of(module, self.params(module)) if fmt.layout == "BHLL3" else None
            converted = None if self._unmasked_call(module, mask, Lq, Lk) else \
                fmt.convert(mask, B=B, Lq=Lq, Lk=Lk, dtype=q.dtype, causal=explicit_causal, heads=heads)
            if sig.context_mask is not None and sig.context in kwargs:
                # BigBird's and BERT's kind: with a context, the layer reads encoder_attention_mask
                # and drops attention_mask
                kwargs[sig.context_mask] = converted
            elif converted is not None or sig.mask_required:
                kwargs[sig.mask] = converted
            elif always_masked(module):
                kwargs[sig.mask] = fmt.convert(torch.ones(1, 1, Lq, Lk, dtype=torch.bool), B=B, Lq=Lq, Lk=Lk,
                                               dtype=q.dtype, heads=heads)
        if sig.rotary is not None:
            head_dim = head_dim_of(module, self.params(module))
            cos, sin = position_embeddings(module, q, conv.rotary, head_dim)  # (B, L, r) each
            # DINOv3's kind broadcasts (L, r) over batch and heads: one row of positions serves all
            kwargs[sig.rotary] = (cos, sin) if cos_sin_batched(module) else (cos[0], sin[0])
        if sig.positions is not None and given_positions(module):  # 0 .. L - 1 for every item
            kwargs[sig.positions] = torch.arange(q.shape[1], device=q.device).expand(q.shape[0], -1)
        if sig.tables is not None:  # a rotation by 0: (L, w) of ones and of zeros
            width = table_width(module, head_dim_of(module, self.params(module)))
            kwargs[sig.tables[0]] = torch.ones(q.shape[1], width, dtype=q.dtype, device=q.device)
            kwargs[sig.tables[1]] = torch.zeros(q.shape[1], width, dtype=q.dtype, device=q.device)
        self._in_layout(conv, kwargs, (sig.input, sig.key, sig.value, sig.context))
        return kwargs

    def cached(self, module: nn.Module, x: torch.Tensor, chunks: tuple[int, ...]) -> torch.Tensor:
        """x (B, L, D) through a transformers Cache in ``chunks``, as a model decodes: each chunk's
        queries at positions start .. start + C - 1 (their rotary angles there), its mask the causal one
        aligned bottom-right over every key the cache holds (HF's model builds it: the layer alone
        would take SDPA's top-left ``is_causal`` for a chunk of several queries)."""
        name = cache_argument(module)
        if name is None:
            raise NotApplicable(f"{type(module).__name__} takes no transformers Cache with a layer_idx")
        sig, conv = read_signature(module), self.conventions(module)
        fmt = library_format(module)[0]

        def call(chunk: torch.Tensor, start: int, cache: object) -> torch.Tensor:
            kwargs = self._kwargs(module, chunk, chunk, chunk, None)
            B, C = chunk.shape[0], chunk.shape[1]
            if sig.mask is not None:
                heads = chunk.shape[-1] // head_dim_of(module, self.params(module)) if fmt.layout == "BHLL3" else None
                kwargs[sig.mask] = fmt.convert(None, B=B, Lq=C, Lk=start + C, dtype=chunk.dtype,
                                               causal="bottom_right", heads=heads)
            if sig.rotary is not None:
                cos, sin = position_embeddings(module, chunk, conv.rotary, head_dim_of(module, self.params(module)),
                                               start=start)
                kwargs[sig.rotary] = (cos, sin) if cos_sin_batched(module) else (cos[0], sin[0])
            kwargs[name] = cache
            out = from_layer(first_output(module(**self._points(module, kwargs))), conv.layout)
            return out[:, 0] if takes_points(module) else out

        return run_chunks(x, chunks, call)

    def set_dropout(self, module: nn.Module, p: float) -> bool:
        return set_all_dropout(module, p)




_WIDTHS: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()


def table_width(module: nn.Module, head_dim: int) -> int:
    """The width of the ``cos, sin`` tables ``module``'s forward takes (:attr:`Signature.tables`): the head
    width (Qwen2.5-VL's vision layer, ``q * cos + rotate_half(q) * sin``) or half of it (MoonViT's complex
    pairs), the first one a call on (1, 2, D) of zeros runs with; a rotation by 0 is the same rotation in
    every layout, so only the width is read. The head width where neither runs (the first forward then
    names the error)."""
    if module not in _WIDTHS:
        sig = read_signature(module)
        assert sig.tables is not None
        d_model = next((p.shape[-1] for p in module.parameters() if p.dim() == 2), head_dim)
        x = torch.zeros(1, 2, d_model, dtype=next((p.dtype for p in module.parameters()), torch.float32))
        _WIDTHS[module] = head_dim
        for width in (head_dim, head_dim // 2):
            try:
                with torch.no_grad():
                    module(**{sig.input: x, sig.tables[0]: torch.ones(2, width, dtype=x.dtype),
                              sig.tables[1]: torch.zeros(2, width, dtype=x.dtype)})
            except Exception:
                continue
            _WIDTHS[module] = width
            break
    return _WIDTHS[module]


def given_positions(module: nn.Module) -> bool:
    """Whether ``module``'s ``position_ids`` are given (0 .. L - 1 for every item): only in a library the
    harness has no facts about (kornia's Gemma raises without them); in one it knows the layer's own
    default is what its models rely on where they pass none."""
    return read_signature(module).positions is not None \
        and library_of(module) not in {library for library, _ in recognition.LIBRARY_FORMATS}


def given_none(module: nn.Module) -> tuple[str, ...]:
    """The forward parameters ``module`` is given None for (:attr:`Signature.unnamed_required`): only in a
    library the harness has no facts about. In one it knows, a required argument is one its models always
    pass (T5Gemma2's merged mask, Gemma 4's shared key-value states), a protocol the harness does not
    model: the layer stays unbuilt, naming it, rather than judged on a call its library never makes."""
    if library_of(module) in {library for library, _ in recognition.LIBRARY_FORMATS}:
        return ()
    return read_signature(module).unnamed_required


def head_dim_of(module: nn.Module, params: MHAParams) -> int:
    """The layer's head width: its ``head_dim`` or ``head_size`` (HF 5.x layers keep it, not their head
    count), else the query rows over its head count."""
    for attr in ("head_dim", "head_size"):
        value = getattr(module, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return params.w_q.shape[0] // n_head_of(module)
