"""The inputs of a whole exported model that takes token ids, read from the names exporters write.

torch.onnx (the names the caller gave), HF Optimum and onnxruntime's transformer optimizer name a
text model's inputs ``input_ids`` (B, L), ``attention_mask`` (B, L) (1 = a real token),
``token_type_ids`` (B, L) and ``position_ids`` (B, L); onnxruntime-genai's builder and Optimum's
``with-past`` exports add ``past_key_values.N.key`` / ``.value`` (or ``past.N.*``) caches. A role is
read from the name alone; ``--model-inputs ROLE=NAME,...`` maps the others by hand. A name no
role fits is refused with the flag that would help, never guessed.

A decoder's cache is read as pairs: input ``past_key_values.N.key`` (B, H_kv, P, Hd) with output
``present.N.key`` (B, H_kv, P + L, Hd), the names Optimum and the genai builder write (``past.N.*``
and ``present_key_values.N.*`` too). A cache input without its present output, or in another
form (one tensor holding both keys and values), is refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import onnx

from mha_verify.properties.onnx.interface import parse_role_map
from mha_verify.properties.onnx.model_file import ModelError

ROLES = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
_ALIASES: dict[str, tuple[str, ...]] = {
    "input_ids": ("input_ids", "input_id", "token_ids", "tokens", "ids"),
    "attention_mask": ("attention_mask", "input_mask", "mask", "padding_mask"),
    "token_type_ids": ("token_type_ids", "segment_ids", "type_ids"),
    "position_ids": ("position_ids", "positions"),
}
#: a KV-cache input of a decoder export (Optimum ``with-past``, onnxruntime-genai's builder)
_CACHE = re.compile(r"^(?:past_key_values?|past|cache)[._]\d+[._](?:key|value|k|v)$"
                    r"|^past_key_values|^past(?:\b|[._]\d)", re.IGNORECASE)
#: the cache pairs read: (layer, key or value) of an input and of the output that extends it
_PAST = re.compile(r"^(?:past_key_values?|past)[._](\d+)[._](key|value)$", re.IGNORECASE)
_PRESENT = re.compile(r"^(?:present_key_values?|present)[._](\d+)[._](key|value)$", re.IGNORECASE)
_INTEGER = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}


@dataclass(frozen=True)
class CachePair:
    """One cache tensor of a decoder: the input it is fed as (B, heads, P, head_dim), the output it
    comes back as (B, heads, P + L, head_dim), and its fixed sizes where the graph states them."""

    past: str
    present: str
    heads: int | None
    head_dim: int | None
    dtype: int  # onnx.TensorProto element type


@dataclass(frozen=True)
class ModelInputs:
    """Which graph input plays each role (``roles``: role -> input name), the graph's outputs (its
    cache outputs apart), and a decoder's cache pairs."""

    roles: dict[str, str]
    outputs: tuple[str, ...]
    sequence: frozenset[str] = frozenset()  # the outputs with a position axis (B, L, ...)
    cache: tuple[CachePair, ...] = ()
    precision: str = "float32"  # what the graph computes in: float32 or float16

    def describe(self) -> str:
        roles = ", ".join(f"{role} <- {name}" for role, name in self.roles.items())
        if not self.cache:
            return roles
        return f"{roles}; KV cache: {len(self.cache)} tensors ({self.cache[0].past} -> {self.cache[0].present}, ...)"


def _dims(value: onnx.ValueInfoProto) -> str:
    dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
            for d in value.type.tensor_type.shape.dim]
    return f"({', '.join(dims)})"


def takes_token_ids(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is a whole text model: an integer input named as token ids, or integer inputs
    of rank 2 only (no float input of rank 3, as an attention layer takes)."""
    inputs = _graph_inputs(model)
    if any(v.name.lower() in _ALIASES["input_ids"] and v.type.tensor_type.elem_type in _INTEGER for v in inputs):
        return True
    ranks = [(v.type.tensor_type.elem_type in _INTEGER, len(v.type.tensor_type.shape.dim)) for v in inputs]
    return bool(ranks) and all(integer and rank == 2 for integer, rank in ranks)


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def parse_model_inputs(text: str | None) -> dict[str, str]:
    """``"input_ids=ids,attention_mask=m"`` -> {"input_ids": "ids", ...}; ValueError naming a bad part."""
    return parse_role_map(text, ROLES, "--model-inputs")


def read_model_inputs(model: onnx.ModelProto, path: Path, mapping: dict[str, str] | None = None) -> ModelInputs:
    """The roles of ``model``'s inputs; ModelError (a usage error) naming each input whose role cannot
    be read and the flag that sets it, a cache input, or a missing ``input_ids``."""
    inputs = _graph_inputs(model)
    by_name = {v.name: v for v in inputs}
    roles: dict[str, str] = {}
    for role, name in (mapping or {}).items():
        if name not in by_name:
            raise ModelError(f"--model-inputs maps {role} to {name!r}, but the inputs of {path.name} are "
                             f"{', '.join(by_name)}")
        roles[role] = name
    listed = ", ".join(f"{v.name} {_dims(v)}" for v in inputs)
    cache = _cache_pairs(model, [v for v in inputs if v.name not in roles.values() and _CACHE.search(v.name)], path)
    for v in inputs:
        if v.name in roles.values() or any(v.name == pair.past for pair in cache):
            continue
        found = next((r for r, names in _ALIASES.items() if v.name.lower() in names and r not in roles), None)
        if found is None:
            raise ModelError(f"cannot tell the role of input {v.name} {_dims(v)} of {path.name} (inputs: {listed}); "
                             f"map it with --model-inputs ROLE={v.name} (roles: {', '.join(ROLES)})")
        roles[found] = v.name
    if "input_ids" not in roles:
        raise ModelError(f"{path.name} has no token-id input (inputs: {listed}); map it with "
                         "--model-inputs input_ids=NAME")
    for role, name in roles.items():
        v = by_name[name]
        if v.type.tensor_type.elem_type not in _INTEGER or len(v.type.tensor_type.shape.dim) != 2:
            raise ModelError(f"input {name} {_dims(v)} of {path.name} is read as {role}, which is an int32 or int64 "
                             "tensor (B, L); map the roles with --model-inputs")
    precision = _precision(model)
    if precision == "bfloat16":
        raise ModelError(f"{path.name} computes in bfloat16: onnxruntime's CPU kernels do not run bfloat16 graphs, "
                         "so it is not validated here (float32 and float16 are)")
    ordered = {r: roles[r] for r in ROLES if r in roles}
    length_axis = by_name[roles["input_ids"]].type.tensor_type.shape.dim[1]
    presents = {pair.present for pair in cache}
    outputs = [o for o in model.graph.output if o.name not in presents]
    return ModelInputs(ordered, tuple(o.name for o in outputs),
                       frozenset(o.name for o in outputs if _has_position_axis(o, length_axis)), tuple(cache),
                       precision)


def _precision(model: onnx.ModelProto) -> str:
    """The precision ``model`` computes in: float16 or bfloat16 where an output is, or where most of its
    float weights are (a conversion that keeps float32 inputs and outputs, onnxruntime's
    ``keep_io_types``), else float32."""
    names = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
    for output in model.graph.output:
        if output.type.tensor_type.elem_type in names:
            return names[output.type.tensor_type.elem_type]
    kinds = [t.data_type for t in model.graph.initializer
             if t.data_type in (onnx.TensorProto.FLOAT, *names) and len(t.dims) >= 2]
    half = [k for k in kinds if k in names]
    return names[half[0]] if kinds and 2 * len(half) > len(kinds) else "float32"


def _cache_pairs(model: onnx.ModelProto, cache: list[onnx.ValueInfoProto], path: Path) -> list[CachePair]:
    """Each cache input with the output that extends it; ModelError naming a cache input in another
    form, or without its present output."""
    presents = {(int(m.group(1)), m.group(2).lower()): o.name
                for o in model.graph.output if (m := _PRESENT.match(o.name))}
    pairs: list[CachePair] = []
    for v in cache:
        match = _PAST.match(v.name)
        dims = v.type.tensor_type.shape.dim
        if match is None or len(dims) != 4:
            raise ModelError(f"{path.name} takes a KV cache as {v.name} {_dims(v)}, not as the per-layer key and value "
                             "tensors (B, heads, past, head_dim) Optimum and onnxruntime-genai write "
                             "(past_key_values.N.key / .value): its decode schedule cannot be driven")
        present = presents.get((int(match.group(1)), match.group(2).lower()))
        if present is None:
            raise ModelError(f"{path.name} takes {v.name} but returns no present.{match.group(1)}.{match.group(2)}: "
                             "a cache that is fed but never extended cannot be driven through a decode")
        fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        pairs.append(CachePair(v.name, present, fixed[1], fixed[3], v.type.tensor_type.elem_type))
    return pairs


def _has_position_axis(output: onnx.ValueInfoProto, length: onnx.TensorShapeProto.Dimension) -> bool:
    """Whether ``output``'s axis 1 is the token ids' length: the same named axis; a graph that names
    neither (no shape information) has one where the output's rank is 3 or more."""
    dims = output.type.tensor_type.shape.dim
    if len(dims) < 2:
        return False
    if length.dim_param and dims[1].dim_param:
        return dims[1].dim_param == length.dim_param
    if dims[1].HasField("dim_value"):
        return False  # a fixed axis (a pooled output's width) is no length
    return len(dims) >= 3
