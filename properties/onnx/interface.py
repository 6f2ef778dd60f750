"""The interface of any attention ONNX model, read from the file without running it.

An attention model is found as either

* three float inputs of rank 3, the roles ``q`` (B, Lq, D), ``k`` (B, Lk, D), ``v`` (B, Lk, D), or
* one float input of rank 3, the role ``x`` (B, L, D) (self-attention: q = k = v = x),

plus, optionally, one mask input: bool or int 0/1, or float, of rank 2, 3 or 4, whose axes
may be fixed to 1 (the model broadcasts them) or to H. The layout (q as (B, L, D) or
(L, B, D)), the mask's axes ((B, Lk), (Lq, Lk), (B*H, Lq, Lk) ...) and its kind (keep, drop,
additive, additive_min) are read from the file or declared (:mod:`properties.onnx.reading`);
q, k and v above are in our batch-first order. Roles are found by name (``q``,
``query``, ``attn_mask`` ...), else by position; ``--inputs q=query,k=key,v=value,mask=m``
maps them by hand (:func:`parse_input_map`).

d_model comes from the static last axis of q/x (or a ``d_model`` metadata entry); n_head from
metadata (``n_head``, ``num_heads``), an attention operator's attribute (ONNX ``Attention``
``q_num_heads``, ``com.microsoft.MultiHeadAttention`` ``num_heads``), a static head axis of
the mask, or the head split of a ``Reshape`` (a constant ``[..., H, Hd]``, ``[..., H, -1]``
or ``[..., -1, Hd]`` with H * Hd = D). Whatever cannot be told is None; the caller turns that
into a one-line usage error naming ``--d-model`` / ``--n-head``.

The mask's *forms* — the mask shapes of the property suite a model can take — follow from
its rank and static size-1 axes: a form fits when every axis the model fixes to 1 is 1 in the
form (a form's size-1 axes are expanded to the model's full ones when it is fed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch

from mha_verify.mha.masks import forms_within
from mha_verify.mha.scoring import Scoring
from mha_verify.properties.onnx.heads import n_head_from_graph, op_conventions
from mha_verify.properties.onnx.model_file import ModelError, load_model
from mha_verify.properties.onnx.reading import (
    CONVENTIONS,
    Reading,
    read_conventions,
    read_layout,
    read_mask_axes,
    read_mask_kind,
)

ROLES = ("q", "k", "v", "x", "mask")
_ALIASES = {
    "q": ("q", "query", "queries", "q_in"),
    "k": ("k", "key", "keys", "k_in"),
    "v": ("v", "value", "values", "v_in"),
    "x": ("x", "input", "inputs", "hidden_states", "hidden", "src", "tokens"),
    "mask": ("mask", "attn_mask", "attention_mask", "attn_bias", "attention_bias", "key_padding_mask"),
}
_NP_DTYPES: dict[int, type] = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
                               onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.BOOL: np.bool_,
                               onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT64: np.int64}
#: mask element types fed 0/1 like a bool mask (HF's raw attention_mask, onnxruntime's mask_index)
_BOOL_LIKE = (np.bool_, np.int32, np.int64)
_TORCH_DTYPES: dict[type, torch.dtype] = {np.float32: torch.float32, np.float16: torch.float16,
                                          np.float64: torch.float64}

Dim = int | str | None  # a fixed size, a symbol, or unknown


@dataclass(frozen=True)
class TensorSpec:
    """One graph input: its name, element type (numpy; ``object`` if unsupported) and dims."""

    name: str
    dtype: type
    dims: tuple[Dim, ...]

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.name} ({dims}) {np.dtype(self.dtype).name if self.dtype is not object else 'other'}"


@dataclass(frozen=True)
class Interface:
    """An attention model's inputs by role, its first output, metadata and sizes.

    ``roles`` maps "q", "k", "v" (cross-attention) or "x" (self-attention), and "mask" if the
    model has one, to graph inputs. ``consumed`` holds the inputs some node reads for their
    values (not only their shape).
    """

    path: Path
    roles: dict[str, TensorSpec]
    output: str
    metadata: dict[str, str]
    d_model: int | None
    n_head: int | None
    n_head_source: str
    consumed: frozenset[str] = field(default_factory=frozenset)
    reading: Reading = field(default_factory=lambda: Reading("batch-first", "default"))
    #: fully_masked / causal / scale: (value, source), where declared or stated by the file
    conventions: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: the fused attention operators found, with their attributes
    operators: tuple[str, ...] = ()
    #: what the eager layer it was exported from computes its scores with that text cannot carry:
    #: its QK-norm (with the layer's norm weights) and a position-bias table (the layer's)
    layer_scoring: Scoring | None = field(default=None, compare=False)

    @property
    def seq_first(self) -> bool:
        return self.reading.layout == "seq-first"

    def dims_of(self, role: str) -> tuple[Dim, ...]:
        """The dims of q, k, v or x in our (B, L, D) order, whatever the model's layout."""
        dims = self.roles[role].dims
        return (dims[1], dims[0], *dims[2:]) if self.seq_first else dims

    @property
    def self_attention(self) -> bool:
        return "x" in self.roles

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: that of q (or x)."""
        first = self.roles["x" if self.self_attention else "q"]
        return _TORCH_DTYPES.get(first.dtype, torch.float32)

    @property
    def mask(self) -> TensorSpec | None:
        return self.roles.get("mask")

    @property
    def mask_types(self) -> frozenset[str]:
        """{"bool"} or {"float"} (the mask's native convention), empty without a mask input."""
        m = self.mask
        if m is None:
            return frozenset()
        return frozenset({"bool"}) if m.dtype in _BOOL_LIKE else frozenset({"float"})

    def mask_axes(self) -> tuple[Dim, Dim, Dim, Dim]:
        """The mask input's dims as (B, H, Lq, Lk) axes; 1 for the axes it lacks (a B*H axis is
        full on both B and H)."""
        m = self.mask
        assert m is not None
        by_label = dict(zip(self.reading.mask_axes, m.dims, strict=True))
        if "B*H" in by_label:
            return (by_label["B*H"], self.n_head, by_label["Lq"], by_label["Lk"])
        return (by_label.get("B", 1), by_label.get("H", 1), by_label.get("Lq", 1), by_label["Lk"])

    @property
    def fixed_axes(self) -> tuple[int | None, int | None, int | None]:
        """(B, Lq, Lk): the size the graph's inputs fix each axis to, None where it is dynamic."""
        first = self.dims_of("x" if self.self_attention else "q")
        lk = first[1] if self.self_attention else self.dims_of("k")[1]

        def fixed(d: Dim) -> int | None:
            return d if isinstance(d, int) else None

        return fixed(first[0]), fixed(first[1]), fixed(lk)

    @property
    def mask_forms(self) -> frozenset[str]:
        """The forms of :data:`FORM_AXES` whose spanned axes the model does not fix to 1."""
        if self.mask is None:
            return frozenset()
        axes = self.mask_axes()
        return forms_within((axes[0] != 1, axes[1] != 1, axes[2] != 1, axes[3] != 1))

    @property
    def label(self) -> str:
        """``exporter-opsetN-dtype`` from mha-verify's metadata, else the file's stem."""
        m = self.metadata
        if {"exporter", "opset", "dtype"} <= m.keys():
            return f"{m['exporter']}-opset{m['opset']}-{m['dtype']}"
        return self.path.stem

    def describe(self) -> str:
        """One line per role, then sizes and mask forms: what ``validate`` prints."""
        lines = [f"interface of {self.path.name}:"]
        for role in ("x", "q", "k", "v", "mask"):
            if role in self.roles:
                lines.append(f"  {role:4} <- {self.roles[role].describe()}")
        lines += self.reading.describe()
        lines += [f"  {key} {value} ({source})" for key, (value, source) in sorted(self.conventions.items())]
        lines += [f"  operator {op}" for op in self.operators]
        if self.mask is None:
            lines.append("  mask: none (the model takes no mask)")
        else:
            lines.append(f"  mask convention {'/'.join(sorted(self.mask_types))}, forms "
                         f"{', '.join(sorted(self.mask_forms)) or 'none'}")
        lines.append(f"  output {self.output}; d_model={self.d_model}, n_head={self.n_head} ({self.n_head_source}); "
                     f"dtype {str(self.dtype).replace('torch.', '')}")
        return "\n".join(lines)


def parse_input_map(text: str | None) -> dict[str, str]:
    """``"q=query,k=key,v=value,mask=attn_mask"`` -> {"q": "query", ...}; ValueError naming bad parts."""
    return parse_role_map(text, ROLES, "--inputs")


def parse_role_map(text: str | None, roles: tuple[str, ...], flag: str) -> dict[str, str]:
    """``"ROLE=NAME,..."`` given to ``flag`` -> {role: name}, each role one of ``roles``; ValueError naming
    the bad part."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for part in text.split(","):
        role, sep, name = part.partition("=")
        role, name = role.strip(), name.strip()
        if not sep or role not in roles or not name:
            raise ValueError(f"{flag} takes ROLE=NAME pairs with ROLE in {', '.join(roles)}, got {part!r}")
        if role in out:
            raise ValueError(f"{flag} names role {role} twice ({out[role]!r} and {name!r})")
        out[role] = name
    return out


def _dims(value: onnx.ValueInfoProto) -> tuple[Dim, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in value.type.tensor_type.shape.dim)


def _assign_roles(inputs: list[TensorSpec], mapping: dict[str, str], path: Path) -> dict[str, TensorSpec]:
    by_name = {i.name: i for i in inputs}
    roles: dict[str, TensorSpec] = {}
    for role, name in mapping.items():
        if name not in by_name:
            raise ModelError(f"--inputs maps {role} to {name!r}, but the model's inputs are {', '.join(by_name)}")
        roles[role] = by_name[name]
    rest = [i for i in inputs if i.name not in {s.name for s in roles.values()}]
    for role, aliases in _ALIASES.items():  # by name
        if role in roles:
            continue
        hit = next((i for i in rest if i.name.lower() in aliases), None)
        if hit is not None:
            roles[role] = hit
            rest.remove(hit)
    # by position: float rank-3 inputs are q, k, v (or x); a bool or other-rank input is the mask
    float3 = [i for i in rest if i.dtype in _TORCH_DTYPES and len(i.dims) == 3]
    for role in (("x",) if len(float3) == 1 and not {"q", "k", "v"} & roles.keys() else ("q", "k", "v")):
        if role not in roles and float3:
            roles[role] = float3.pop(0)
    rest = [i for i in rest if i.name not in {s.name for s in roles.values()}]
    if "mask" not in roles and rest:
        roles["mask"] = rest.pop(0)
    names = ", ".join(i.describe() for i in inputs)
    if rest:
        raise ModelError(f"cannot tell what inputs {', '.join(i.name for i in rest)} of {path.name} are "
                         f"(inputs: {names}); map them with --inputs q=...,k=...,v=...,mask=...")
    if "x" in roles and {"q", "k", "v"} & roles.keys():
        raise ModelError(f"{path.name} has both x and q/k/v inputs ({names}); map them with --inputs")
    if "x" not in roles and not {"q", "k", "v"} <= roles.keys():
        missing = [r for r in ("q", "k", "v") if r not in roles]
        raise ModelError(f"{path.name} has no input for {', '.join(missing)} (inputs: {names}); an attention model "
                         "takes q, k, v (B, L, D) or one x (B, L, D); map them with --inputs")
    for role, spec in roles.items():
        if role == "mask":
            if spec.dtype not in (*_BOOL_LIKE, *_TORCH_DTYPES) or len(spec.dims) not in (2, 3, 4):
                raise ModelError(f"mask input {spec.describe()} must be bool, int32/int64 (0/1) or float of rank 2, 3 "
                                 "or 4")
        elif spec.dtype not in _TORCH_DTYPES or len(spec.dims) != 3:
            raise ModelError(f"input {role} = {spec.describe()} must be a float tensor (B, L, D)")
    return roles


def _read(roles: dict[str, TensorSpec], metadata: dict[str, str], declared: dict[str, str]) -> Reading:
    """The layout, mask axes and mask kind (:mod:`properties.onnx.reading`)."""
    first = roles["x" if "x" in roles else "q"]
    key = roles.get("k")
    mask = roles.get("mask")
    layout, layout_source = read_layout((first.name, first.dims), None if key is None else (key.name, key.dims),
                                        None if mask is None else (mask.name, mask.dims), metadata, declared)
    if mask is None:
        return Reading(layout, layout_source)
    b_axis, l_axis = (1, 0) if layout == "seq-first" else (0, 1)
    lk = (key or first).dims[l_axis]
    axes, axes_source = read_mask_axes((mask.name, mask.dims), first.dims[b_axis], first.dims[l_axis], lk,
                                       metadata, declared)
    kind, kind_source, kind_declared = read_mask_kind(mask.name, mask.dtype in _BOOL_LIKE, metadata, declared)
    return Reading(layout, layout_source, axes, axes_source, kind, kind_source, kind_declared)


def read_interface(path: str | os.PathLike[str], *, mapping: dict[str, str] | None = None,
                   d_model: int | None = None, n_head: int | None = None,
                   declared: dict[str, str] | None = None) -> Interface:
    """Read the interface of the attention model at ``path``; ModelError (one line) if it has none
    or cannot be told without a declaration.

    ``mapping`` (role -> input name) overrides the detection of roles; ``d_model`` and
    ``n_head`` override what the file tells (and are checked against a static q axis);
    ``declared`` holds ``layout``, ``mask_axes`` and ``mask_kind`` as ``validate`` takes them.
    """
    path = Path(path)
    model = load_model(path, external_data=False)  # the graph is all the interface needs
    inits = {i.name for i in model.graph.initializer}
    inputs = [TensorSpec(i.name, _NP_DTYPES.get(i.type.tensor_type.elem_type, object), _dims(i))
              for i in model.graph.input if i.name not in inits]
    roles = _assign_roles(inputs, mapping or {}, path)
    metadata = {p.key: p.value for p in model.metadata_props}
    try:
        reading = _read(roles, metadata, declared or {})
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    first = roles["x" if "x" in roles else "q"]
    static_d = first.dims[-1] if isinstance(first.dims[-1], int) else None
    if d_model is None:
        d_model = static_d if static_d is not None else (
            int(metadata["d_model"]) if metadata.get("d_model", "").isdigit() else None)
    elif static_d is not None and static_d != d_model:
        raise ModelError(f"--d-model {d_model} but the model's input {first.name} has feature size {static_d}")
    source = "--n-head"
    if n_head is None:
        key = next((k for k in ("n_head", "num_heads", "num_attention_heads") if metadata.get(k, "").isdigit()), None)
        if key is not None:
            n_head, source = int(metadata[key]), f"metadata {key}"
        else:
            mask = roles.get("mask")
            h = mask.dims[1] if mask is not None and len(mask.dims) == 4 else None
            if isinstance(h, int) and h > 1:
                n_head, source = h, "the mask's head axis"
            else:
                n_head, source = n_head_from_graph(model, d_model)
    if d_model is not None and n_head is not None and d_model % n_head:
        raise ModelError(f"d_model={d_model} is not divisible by n_head={n_head} ({source})")
    from_ops, numbers, operators = op_conventions(model)
    if "scale" in numbers:
        from_ops["scale"] = repr(numbers["scale"])
    conventions_ = {k: v for k, v in (declared or {}).items() if k in CONVENTIONS}
    try:
        conventions = read_conventions(metadata, from_ops, conventions_)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    if ("kv_num_heads" in numbers and n_head is not None and int(numbers["kv_num_heads"]) != n_head
            and "x" not in roles):  # one input x: the key/value width is the graph's own (its weights say it)
        raise ModelError(f"{path.name}'s attention operator has kv_num_heads={int(numbers['kv_num_heads'])} of "
                         f"n_head={n_head}: grouped-query ONNX models with q, k, v inputs of their own are not "
                         "validated yet")
    # read for their values: a Shape node reads only the shape (what is left of an input whose
    # place another input took)
    consumed = ({name for node in model.graph.node if node.op_type != "Shape" for name in node.input}
                | {o.name for o in model.graph.output})
    return Interface(path, roles, model.graph.output[0].name, metadata, d_model, n_head, source,
                     frozenset(consumed & {i.name for i in inputs}), reading, conventions, tuple(operators))
