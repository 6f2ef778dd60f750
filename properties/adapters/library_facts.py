"""What a layer's library and forward source say before it is called: whose mask conventions it
follows, what mask it always applies, whether it takes point batches (SAM), and which source
facts (an exact mask shape, other operators between the scores and the softmax) bind its calls.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import weakref
from typing import NamedTuple

from torch import nn

from mha_verify.properties.adapters import recognition
from mha_verify.properties.adapters.forward_source import forward_sources
from mha_verify.properties.adapters.mask_reading import read_fill, read_mask
from mha_verify.properties.adapters.signature import (
    KEY_PADDING,
    LENGTHS,
    MASK_NAMES,
    PADDING_NAMES,
    MaskFormat,
    read_signature,
)

#: the libraries whose conventions :data:`recognition.LIBRARY_FORMATS` knows
KNOWN_LIBRARIES = frozenset(library for library, _ in recognition.LIBRARY_FORMATS)


def library_of(module: nn.Module) -> str:
    """The library whose conventions the layer follows: that of the first class in its MRO from a
    library :data:`recognition.LIBRARY_FORMATS` knows (a user's subclass of diffusers' Attention
    is called as diffusers calls it), else the top-level package of its own class."""
    known = {library for library, _ in recognition.LIBRARY_FORMATS}
    for cls in type(module).__mro__:
        top = cls.__module__.split(".")[0]
        if top in known:
            return top
    return type(module).__module__.split(".")[0]


#: transformers' dispatch written as an attribute lookup (Kosmos-2.5's vision attention): AttentionInterface is a
#: mapping with no such attributes, so the default, eager_attention_forward, is what runs
_GETATTR_INTERFACE = re.compile(r"getattr\(\s*ALL_ATTENTION_FUNCTIONS\s*,")


def library_format(module: nn.Module) -> tuple[MaskFormat, str, str]:
    """(mask format, fully masked convention, a note) for the library ``module`` comes from
    (:data:`mha_verify.properties.adapters.recognition.LIBRARY_FORMATS`).

    The implementation is the layer's config's ``_attn_implementation``; a layer built
    standalone has None there, and HF's dispatch then falls back to ``eager_attention_forward``.
    """
    implementation = str(getattr(getattr(module, "config", None), "_attn_implementation", None) or "eager")
    if callable(getattr(module, "compute_bias", None)):
        # a bias reaches HF's attention function only from a layer that computes one (T5's and
        # UMT5's compute_bias, zeros where it has no table); LayoutLMv3's and PP-DocLayout's come
        # from their models, through a position_bias argument: None here
        implementation += "+position_bias"
    library = library_of(module)
    read = read_sources(forward_sources(module))
    dispatch = ""
    if library == "transformers" and any(_GETATTR_INTERFACE.search(source) for _, source in forward_sources(module)):
        implementation, dispatch = "eager", (
            f"; its forward looks its attention function up with getattr(ALL_ATTENTION_FUNCTIONS, ...), an "
            f"attribute the registry does not have: eager_attention_forward runs whatever _attn_implementation "
            f"says ({implementation!r}), so it is called as eager")
    if library == "diffusers":  # its processors repeat a (B, Lq, Lk) mask over heads, or pass it as is
        implementation = read.processor_masks
    row = recognition.library_format(library, implementation)
    exact = read.exact_mask
    sig = read_signature(module)
    mask = sig.mask
    if sig.lengths:  # key padding as lengths (B,): the fill its source uses says what a length of 0 gives
        fill = read_fill(forward_sources(module))
        said = {"nan": "; a fully padded item gets NaN (an -inf fill)",
                "uniform": "; a fully padded item gets uniform weights (a finite fill)"}.get(fill or "", "")
        return LENGTHS, fill or row.fully_masked, f"key padding given as lengths ({mask} (B,), by its name){said}"
    if mask in PADDING_NAMES:  # its only mask is key padding, whatever its library's
        fill = read_fill(forward_sources(module)) if row is recognition.UNKNOWN_LIBRARY else None
        if fill is not None:  # fairseq's masked_fill(key_padding_mask..., -inf): NaN on a fully padded item
            said = "NaN (an -inf fill)" if fill == "nan" else "uniform weights (a finite fill)"
            return KEY_PADDING, fill, f"a fully masked row gets {said}, read from its source"
        return KEY_PADDING, row.fully_masked, row.note
    if row is recognition.UNKNOWN_LIBRARY and mask is not None:  # no facts of its library: its source's
        reading = read_mask(forward_sources(module), mask, _other_masks(module, mask))
        if reading.how:
            fmt = reading.format(row.mask)
            how = list(reading.how)
            fully = reading.fully_masked
            if fully is None and not sdpa_taken(module):
                # an SDPA path beside a fill of its own (MONAI's SABlock: ``if self.use_flash_attention``),
                # and this instance's flag takes the other: the fill says what a fully masked row gives
                fully = read_fill(forward_sources(module))
                if fully:
                    how.append(f"a fully masked row gets {_FILL_WORDS[fully]}: its SDPA path is off here")
            return fmt, fully or row.fully_masked, f"mask convention read from its source: {'; '.join(how)}"
    return (row.mask if exact is None else dataclasses.replace(row.mask, layout=exact)), row.fully_masked, \
        row.note + dispatch


_FILL_WORDS = {"nan": "NaN (an -inf fill)", "uniform": "uniform weights (a finite fill)"}


def sdpa_taken(module: nn.Module) -> bool:
    """Whether ``module``'s forward, as this instance is set, reaches its call to torch's
    ``scaled_dot_product_attention``: False only where every such call sits in the body of ``if self.flag:``
    (or of ``if not self.flag:``) and the instance's flag says that body is skipped, read from the source
    and the attribute, nothing run; True where it cannot be told. The guard read is the outermost ``if``
    whose body holds the call."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(module).forward)))
    except (OSError, TypeError, SyntaxError):
        return True
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))
             and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id) == "scaled_dot_product_attention"]
    if not calls:
        return True
    for call in calls:
        guard = next((branch for branch in ast.walk(tree) if isinstance(branch, ast.If)
                      and any(n is call for part in branch.body for n in ast.walk(part))), None)
        test = guard.test if guard is not None else None
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        flag = test.operand if negated and isinstance(test, ast.UnaryOp) else test
        if not (isinstance(flag, ast.Attribute) and isinstance(flag.value, ast.Name) and flag.value.id == "self"):
            return True
        value = getattr(module, flag.attr, None)
        if not isinstance(value, bool) or value != negated:
            return True  # the flag takes the call (or is not a plain bool)
    return False


def _other_masks(module: nn.Module, name: str) -> tuple[str, ...]:
    """The forward's parameters other than ``name`` with a mask's name (``mask`` beside ``attn_mask``)."""
    try:
        params = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return ()
    return tuple(n for n in params if n != name and n in (*MASK_NAMES, *PADDING_NAMES))


def rows_unspecified(module: nn.Module) -> str | None:
    """Why ``module``'s library leaves fully masked rows unspecified
    (:data:`recognition.UNSPECIFIED_ROWS`), or None."""
    return recognition.UNSPECIFIED_ROWS.get(library_of(module))


#: a parameter's own comment saying its forward does not use it ("# Not used but kept for signature
#: matching", "# unused", "# ignored"), on the line that declares it
_IGNORED_NOTE = re.compile(r"#[^\n]*\b(not used|unused|ignored)\b", re.IGNORECASE)


def mask_switch(module: nn.Module, name: str) -> str | None:
    """Where the layer reads its mask only as a flag (whisper's SDPA path: ``is_causal=mask is not
    None and n_ctx > 1``), quoted; None where it applies it."""
    if library_of(module) in {library for library, _ in recognition.LIBRARY_FORMATS}:
        return None
    switch = read_mask(forward_sources(module), name, _other_masks(module, name)).switch
    return None if switch is None else f"its source reads it only as a switch: {switch}"


def mask_unsupported(module: nn.Module, name: str) -> str | None:
    """Where the layer takes a mask of a form the harness does not draw, in words; None otherwise."""
    if library_of(module) in {library for library, _ in recognition.LIBRARY_FORMATS}:
        return None
    return read_mask(forward_sources(module), name, _other_masks(module, name)).unsupported


def argument_ignored(module: nn.Module, name: str) -> str | None:
    """The forward's own words where the line declaring parameter ``name`` says it is not used
    (PP-OCR recognizers' ``attention_mask: ... = None,  # Not used but kept for signature
    matching``), quoted with where it is; None where no such comment is there."""
    declared = re.compile(rf"^\s*{re.escape(name)}\s*[:=,)]")
    for where, source in forward_sources(module):
        for line in source.splitlines():
            if declared.match(line) and _IGNORED_NOTE.search(line):
                return f"its source declares it so, in {where}: `{line.strip()}`"
    return None


def argument_unread(module: nn.Module, name: str) -> str | None:
    """Where the layer takes parameter ``name`` and never reads it: the body of its forward (or,
    where the forward has no such parameter, of its diffusers processor) names it nowhere, so
    whatever is passed is dropped (ErnieImage's single-stream attention takes
    ``encoder_hidden_states`` for the shared signature and hands its processor ``hidden_states``
    alone); None where it is read, or the source cannot be parsed."""
    return _unread(forward_sources(module), name)


@functools.lru_cache(maxsize=256)
def _unread(sources: tuple[tuple[str, str], ...], name: str) -> str | None:
    """Parsed once per (sources, name): the adapter reads conventions at every call of a layer."""
    for where, source in sources:
        try:
            tree = ast.parse(textwrap.dedent(source))
        except SyntaxError:
            continue
        fn = next((node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))),
                  None)
        if fn is None:
            continue
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
        if name not in params:
            continue
        body = ast.Module(body=fn.body, type_ignores=[])
        names = {node.id for node in ast.walk(body) if isinstance(node, ast.Name)}
        if name in names or names & {"locals", "vars"}:  # read, or perhaps read through locals()
            return None
        return f"{where} takes {name} and never reads it: what is passed is dropped"
    return None


def always_masked(module: nn.Module) -> str:
    """Why ``module`` is called with an all-keep mask where an example has none, or "".

    HF's ``sdpa_attention_forward`` takes a layer with no ``is_causal`` attribute as causal, and
    applies causality when it gets no mask. Such layers are the older ones, whose models build
    their masks themselves (BERT's ``get_extended_attention_mask`` kind: ones where none is given;
    Mllama's vision encoder, LayoutLM) and never call them without one: called so here too, and
    said. (A model that called one with None would be causal by mistake: a model's bug, which a
    layer's gate cannot see.)
    """
    config = getattr(module, "config", None)
    if library_of(module) != "transformers" or hasattr(module, "is_causal") \
            or getattr(config, "_attn_implementation", None) != "sdpa":
        return ""
    return ("no is_causal attribute (HF's sdpa would make it causal without a mask): called with an all-keep mask "
            "where an example has none, as its model always passes one")


#: a forward that reads a second batch axis from its inputs (SAM 2's ``batch_size, point_batch_size =
#: query.shape[:2]``, SAM's ``point_batch_size = query.shape[1]``): called with inputs (B, 1, L, D)
_POINT_BATCH = re.compile(r"point_batch_size\s*=\s*\w+\.shape\[(:2|1)\]")


def takes_points(module: nn.Module) -> bool:
    return read_sources(forward_sources(module)).points


#: a forward that compares its mask's size to one shape and raises on any other: that layout exactly
_EXACT_MASK = (
    (re.compile(r"attention_mask\.size\(\)\s*!=\s*\(\w+,\s*1,\s*\w+,\s*\w+\)"), "B1LL"),  # LED, XGLM
    (re.compile(r"attention_mask\.size\(\)\s*!=\s*\(\w+\s*\*\s*self\.num_heads,\s*\w+,\s*\w+\)"), "BHLL3"),
)


#: (what in a forward's source shows another operator than softmax attention over every key, what it is)
_OTHER_OPERATORS = (
    (re.compile(r"torch\.fft\."), "computes through torch.fft (an auto-correlation, not softmax attention)"),
    # Informer's ProbSparse: keys sampled at random pick the queries that attend; the others get a mean
    (re.compile(r"torch\.(randint|randperm|multinomial)\("),
     "samples at random (ProbSparse's kind: a random subset of keys picks the queries that attend)"),
    # LongT5's local and transient-global layers: attention within blocks (and their neighbours)
    (re.compile(r"\bblock_len\b"), "attends within blocks of block_len keys (LongT5's local attention), "
                                    "a structure the oracle does not model"),
    # Reformer's local attention: chunks that see their neighbours, the first one the last
    (re.compile(r"\b_look_adjacent\(|\b_split_seq_length_dim_to\("),
     "attends within chunks and their neighbours (Reformer's chunked attention), a structure the oracle does "
     "not model"),
    # Qwen2.5-Omni's DiT: query[:, :1], key[:, :1] = apply_rotary_pos_emb(...)
    (re.compile(r"\w+\[:,\s*:\d+\]\s*(,\s*\w+\[:,\s*:\d+\]\s*)?=\s*apply_rotary_pos_emb\("),
     "rotates some of its heads only (rotary on a slice of the heads), a step the oracle does not model"),
)


#: the same for layers of libraries the harness has no facts about: operators their names announce
#: (linear attention, cosine-similarity attention) that no layer of a known library reaches this way
_OTHER_OPERATORS_UNKNOWN = (
    # keys contracted with the values over positions n, before the queries: (n d, n e -> d e), or with
    # positions last (denoising-diffusion's ``'b h d n, b h e n -> b h d e'``)
    (re.compile(r"\b(?:k|keys?)\w*\s*\.softmax\(\s*dim\s*=\s*-2\s*\)"
                r"|einsum\(\s*['\"][^'\"]*\bn d\s*,\s*[^'\"]*\bn e\s*->\s*[^'\"]*\bd e\b"
                r"|einsum\(\s*['\"][^'\"]*\bd n\s*,\s*[^'\"]*\be n\s*->\s*[^'\"]*\bd e\b"),
     "computes linear attention (keys normalized over positions and contracted with the values before the "
     "queries), not softmax attention over every key"),
    (re.compile(r"\bmap\(\s*l2norm\s*,|\bl2norm\(\s*q\b|F\.normalize\(\s*q\w*\s*,"),
     "computes cosine-similarity attention (q and k L2-normalized, scaled by a constant of its own), a scoring "
     "the oracle does not model for it"),
)


#: operators of :data:`_OTHER_OPERATORS_UNKNOWN` under which the laws still hold (q and k normalized
#: position by position, every key reached): such a layer is verified by the laws alone
LAWFUL_OPERATORS = frozenset(what for _, what in _OTHER_OPERATORS_UNKNOWN)


def other_operator(module: nn.Module) -> str:
    """What the layer's source shows it computes instead of softmax attention over every key, or "". For
    a layer of a library the harness has no facts about, its forward is read as this instance runs it
    (:func:`taken`): open_clip's cosine attention under ``if self.logit_scale is not None:`` is not what a
    layer built without it computes."""
    sources = forward_sources(module)
    found = read_sources(sources).other_operator
    if found or library_of(module) in {library for library, _ in recognition.LIBRARY_FORMATS}:
        return found
    return _unknown_operator(tuple((where, taken(module, text) if i == 0 else text)
                                   for i, (where, text) in enumerate(sources)))


_UNSET = object()


def _decided(module: nn.Module, test: ast.expr) -> bool | None:
    """Whether ``test`` holds for this instance where it reads one attribute of it only: ``self.flag`` and
    ``not self.flag`` (a bool), ``self.x is None``, ``self.x is not None``, lucidrains' ``exists(self.x)``;
    None where it reads anything else."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    inner = test.operand if isinstance(test, ast.UnaryOp) and negated else test
    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "exists" \
            and len(inner.args) == 1:  # exists(self.x): self.x is not None
        inner = ast.Compare(inner.args[0], [ast.IsNot()], [ast.Constant(None)])
    if isinstance(inner, ast.Compare) and len(inner.ops) == 1 and isinstance(inner.ops[0], (ast.Is, ast.IsNot)) \
            and isinstance(inner.comparators[0], ast.Constant) and inner.comparators[0].value is None:
        value = _attribute(module, inner.left)
        if value is _UNSET:
            return None
        held = (value is None) == isinstance(inner.ops[0], ast.Is)
    else:
        value = _attribute(module, inner)
        if not isinstance(value, bool):
            return None
        held = value
    return not held if negated else held


def _attribute(module: nn.Module, node: ast.expr) -> object:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return getattr(module, node.attr, _UNSET)
    return _UNSET


_TAKEN: weakref.WeakKeyDictionary[nn.Module, dict[str, str]] = weakref.WeakKeyDictionary()


def taken(module: nn.Module, source: str) -> str:
    """``source`` (``module``'s forward) without the branches this instance never takes (:func:`_decided`:
    the body of an ``if`` whose test is false, the ``else`` of one whose test is true); the source as it is
    where it does not parse. Read once per module: its conventions are read at every call."""
    read = _TAKEN.setdefault(module, {})
    if source not in read:
        read[source] = _taken(module, source)
    return read[source]


def _taken(module: nn.Module, source: str) -> str:
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return source

    class _Prune(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
            self.generic_visit(node)
            held = _decided(module, node.test)
            if held is None:
                return node
            return (node.body if held else node.orelse) or [ast.Pass()]

    return ast.unparse(_Prune().visit(tree))


@functools.lru_cache(maxsize=256)
def _unknown_operator(sources: tuple[tuple[str, str], ...]) -> str:
    """Read once per source text: conventions are read at every call of a layer."""
    text = "\n".join(source for _, source in sources)
    return next((what for pattern, what in _OTHER_OPERATORS_UNKNOWN if pattern.search(text)), "")


class SourceFacts(NamedTuple):
    """What a layer's forward (and processor) source shows, read once per source."""

    other_operator: str  # of :data:`_OTHER_OPERATORS`, or ""
    exact_mask: str | None  # a layout of :data:`_EXACT_MASK`, or None
    points: bool  # a second batch axis (:data:`_POINT_BATCH`)
    processor_masks: str  # diffusers: "get_attention_scores", "prepare_attention_mask" or "as_is"


@functools.lru_cache(maxsize=256)
def read_sources(sources: tuple[tuple[str, str], ...]) -> SourceFacts:
    """The facts of :func:`forward_sources`' text: conventions and calls ask at every call of a layer."""
    text = "\n".join(source for _, source in sources)
    return SourceFacts(
        other_operator=next((what for pattern, what in _OTHER_OPERATORS if pattern.search(text)), ""),
        exact_mask=next((layout for pattern, layout in _EXACT_MASK if pattern.search(text)), None),
        points=bool(_POINT_BATCH.search(text)),
        processor_masks="get_attention_scores" if "get_attention_scores" in text
        else "prepare_attention_mask" if "prepare_attention_mask" in text else "as_is")
