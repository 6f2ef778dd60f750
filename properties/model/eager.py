"""The eager model an export came from: a transformers ``save_pretrained`` folder, or a
``module:factory`` / ``file.py:factory`` spec (a factory called with no arguments, or a class built
with none), called as the export is: by keyword, with the roles the graph takes.

The oracle is this model in float64, the allowance comes from the same model in the precision the
export computes in (float32, or float16 for a converted graph: its own rounding there):
:class:`EagerModel` holds both copies. A transformers model's float64 copy runs its SDPA attention,
not its eager one: the eager attention casts the softmax to float32 on purpose (an upcast for half
precision), which in float64 turns the mask's ``finfo(float64).min`` into -inf and a fully masked
row (a left-padded pad) into NaN, then every token after it through the values (Llama at
transformers 5.25)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from mha_verify.properties.loading import load_attr
from mha_verify.properties.protocol import TargetError

#: the longest sequence drawn where a model states no maximum of its own
DEFAULT_MAX_LENGTH = 129


@dataclass(frozen=True)
class AttentionDims:
    """The attention sizes the eager model's config states (None where it states none): query heads,
    key/value heads, head dim, the softmax scale 1/sqrt(head dim) where nothing in the config
    says the model scales otherwise (T5's unscaled scores, Gemma's query_pre_attn_scalar, ...), and
    its rotary: base and type (transformers 5's ``rope_parameters``, 4's ``rope_theta`` and
    ``rope_scaling``)."""

    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    scale: float | None
    rope_base: float | None = None  # the config's rope_theta
    rope_type: str = ""  # "default" for plain RoPE; another (llama3, yarn, ...) scales its frequencies


#: config fields that say a model's softmax scale is not 1/sqrt(head_dim)
_OTHER_SCALING = ("query_pre_attn_scalar", "attention_multiplier", "attn_scale", "scale_attn_weights",
                  "relative_attention_num_buckets", "scale_attn_by_inverse_layer_idx", "mup_width_scale",
                  "attn_scale_factor")


@dataclass
class EagerModel:
    """``exact``: the model in float64 (the oracle); ``same``: in ``dtype``, the precision the export
    computes in (float32, or float16 for a converted graph)."""

    exact: nn.Module
    same: nn.Module
    vocab_size: int
    max_length: int
    type_vocab_size: int
    source: str
    dims: AttentionDims = field(default_factory=lambda: AttentionDims(None, None, None, None))
    dtype: torch.dtype = torch.float32

    @property
    def cache_dims(self) -> tuple[int | None, int | None]:
        """A decoder cache's (kv heads, head dim) as the config states them."""
        return self.dims.kv_heads, self.dims.head_dim

    @property
    def padding_unspecified(self) -> str:
        """Why the outputs at padding are don't-care ("" where nothing says so): transformers' models
        leave padded rows, and whole padded items, unspecified."""
        if type(self.same).__module__.split(".")[0] == "transformers":
            return "transformers leaves padded rows unspecified"
        return ""

    def run(self, inputs: dict[str, torch.Tensor], names: tuple[str, ...], *, exact: bool) -> dict[str, torch.Tensor]:
        """The outputs named ``names`` (the graph's), each a float64 tensor, from one call by keyword."""
        model = self.exact if exact else self.same
        with torch.no_grad():
            out = model(**inputs)
        return {name: value.double() for name, value in zip(names, _outputs(out, names), strict=True)}


def _outputs(out: object, names: tuple[str, ...]) -> list[torch.Tensor]:
    """The model's outputs in the graph's order: by name from a dict-like output (HF's ModelOutput),
    else by position from a tuple, or the one tensor."""
    found: list[object]
    if isinstance(out, torch.Tensor):
        found = [out]
    elif isinstance(out, Mapping) and all(n in out for n in names):  # HF's ModelOutput is an OrderedDict
        found = [out[n] for n in names]
    elif callable(getattr(out, "to_tuple", None)):
        found = list(out.to_tuple())  # type: ignore[attr-defined]
    elif isinstance(out, (tuple, list)):
        found = list(out)
    else:
        raise TargetError(f"the eager model returned a {type(out).__name__}, not tensors")
    tensors = [t for t in found if isinstance(t, torch.Tensor)]
    if len(tensors) < len(names):
        raise TargetError(f"the eager model returns {len(tensors)} tensors where the graph has {len(names)} outputs "
                          f"({', '.join(names)})")
    return tensors[:len(names)]


def load_eager_model(spec: str, dtype: torch.dtype = torch.float32) -> EagerModel:
    """The eager model of ``spec`` (a folder with config.json, or a factory spec), its ``same`` copy in
    ``dtype``; TargetError naming what is wrong. Nothing is downloaded: a folder is read with
    ``local_files_only``."""
    path = Path(spec)
    if path.is_dir():
        model: object = _from_folder(path)
        source = f"the transformers model in {path}"
    else:
        obj = load_attr(spec)
        try:
            model = obj() if callable(obj) else obj
        except (Exception, SystemExit) as exc:  # a factory that exits is a usage error, not our exit
            raise TargetError(f"calling {spec} with no arguments raised {type(exc).__name__}: {exc}") from None
        source = spec
    if not isinstance(model, nn.Module):
        raise TargetError(f"--eager {spec} gave a {type(model).__name__}, not a torch.nn.Module")
    exact = _float64_attention(copy.deepcopy(model).double().eval())
    model = model.to(dtype).eval()
    return EagerModel(exact, model, _vocab_size(model, spec), _max_length(model), _type_vocab(model), source,
                      _attention_dims(model), dtype)


def _float64_attention(model: nn.Module) -> nn.Module:
    """``model`` (float64) with attention that computes in float64: a transformers model switched to
    SDPA where it supports it (its eager softmax runs in float32), any other model as it is."""
    switch = getattr(model, "set_attn_implementation", None)
    if callable(switch) and getattr(getattr(model, "config", None), "_attn_implementation", None) == "eager":
        with contextlib.suppress(ValueError, ImportError, NotImplementedError):  # without SDPA: eager kept
            switch("sdpa")
    return model


def _from_folder(path: Path) -> nn.Module:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise TargetError(f"--eager {path} is a folder without config.json: not a save_pretrained folder")
    try:
        import transformers
    except ImportError:
        raise TargetError(f"--eager {path} is a transformers folder, and transformers is not installed") from None
    try:
        architectures = json.loads(config_file.read_text()).get("architectures") or []
    except (OSError, ValueError) as exc:
        raise TargetError(f"cannot read {config_file}: {exc}") from None
    names = [a for a in architectures if isinstance(a, str) and a.isidentifier()]
    # a class of transformers' own, by the name its config gives: never code from the folder
    cls = next((getattr(transformers, n) for n in names if isinstance(getattr(transformers, n, None), type)
                and issubclass(getattr(transformers, n), transformers.PreTrainedModel)), transformers.AutoModel)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:  # eager attention: the reference the export is held to, whatever kernel the export traced
        return cls.from_pretrained(str(path), local_files_only=True, attn_implementation="eager")
    except Exception as exc:
        raise TargetError(f"loading {cls.__name__} from {path} raised {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def _vocab_size(model: nn.Module, spec: str) -> int:
    config = getattr(model, "config", None)
    for owner, attr in ((config, "vocab_size"), (model, "vocab_size")):
        value = getattr(owner, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if embedding is None:
        raise TargetError(f"--eager {spec}: no vocab_size attribute or config field and no nn.Embedding to read "
                          "the vocabulary's size from")
    return int(embedding.num_embeddings)


def _max_length(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    for owner, attr in ((config, "max_position_embeddings"), (model, "max_positions"), (config, "n_positions")):
        value = getattr(owner, attr, None)
        if isinstance(value, int) and value > 1:
            return min(value, DEFAULT_MAX_LENGTH)
    return DEFAULT_MAX_LENGTH


def _attention_dims(model: nn.Module) -> AttentionDims:
    """The attention sizes of ``model``'s config (a graph may leave a cache's head dim symbolic: the
    genai builder names it ``kv_cache_dim``); None where the config states none."""
    config = getattr(model, "config", None)

    def number(name: str) -> int | None:
        value = getattr(config, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    heads = number("num_attention_heads")
    kv_heads = number("num_key_value_heads") or heads
    head_dim = number("head_dim")
    if head_dim is None and heads and number("hidden_size"):
        head_dim = int(number("hidden_size") or 0) // heads
    other = config is None or any(hasattr(config, name) for name in _OTHER_SCALING)
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    rope = rope if isinstance(rope, dict) else {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    kind = rope.get("rope_type", rope.get("type", "default" if theta is not None else ""))
    return AttentionDims(heads, kv_heads, head_dim, None if other or head_dim is None else head_dim ** -0.5,
                         float(theta) if isinstance(theta, (int, float)) and theta > 1 else None,
                         kind if isinstance(kind, str) else "")


def _type_vocab(model: nn.Module) -> int:
    value = getattr(getattr(model, "config", None), "type_vocab_size", None)
    return value if isinstance(value, int) and value > 0 else 1
