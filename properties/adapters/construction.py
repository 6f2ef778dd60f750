"""How a layer class is built at (d_model, n_head) with no user code.

Its constructor's parameters are matched by *name* against :data:`PARAMETER_ROLES` (sizes, a
layer index) and ``config``; the tables are data, so that a library's spelling is a row:

* every required parameter named: keywords, e.g. ``Attention(query_dim=D, heads=H,
  dim_head=D/H)`` (diffusers), ``BartAttention(embed_dim=D, num_heads=H, config=BartConfig)``,
  ``LlamaAttention(config=LlamaConfig, layer_idx=0)``;
* otherwise positionally, ``Attr(d_model, n_head)``, the documented default.

A parameter named ``config`` (``cfg``, ``args``) gets the layer's library's own config class
(a transformers or diffusers config, or a dataclass named ``*Config``):
its annotation (``LlamaConfig``, ``CLIPVisionConfig | CLIPTextConfig``: the first that builds),
else a config class the layer's module holds, the one sharing the longest prefix with the
layer's name first. The config is built with its defaults and the sizes set afterwards, on the
fields it has (:data:`CONFIG_ROLES`): a default config passes the library's validation, and HF
5.x validates at construction, where half-set sizes are refused. A layer whose library has no
config class gets :func:`config_for`'s namespace of every field name the libraries use.

Reading a signature or an annotation runs nothing of the layer's: annotations are looked up
by name in the layer's module, never evaluated.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from torch import nn

from mha_verify.properties.adapters.attention_core import (
    CoreInProjections,
    core_layout,
    core_module,
    describe_core,
    takes_heads,
)

#: a constructor parameter's name -> the size it is given
PARAMETER_ROLES: dict[str, str] = {
    **dict.fromkeys(("d_model", "embed_dim", "hidden_size", "dim", "query_dim", "n_embd", "embed_size",
                     "model_dim", "hidden_dim", "n_state", "emb_size", "n_channels", "channels"), "d_model"),
    **dict.fromkeys(("n_head", "num_heads", "heads", "n_heads", "num_attention_heads", "nhead",
                     "attention_heads"), "n_head"),
    **dict.fromkeys(("head_dim", "dim_head", "attention_head_dim", "d_head", "head_size", "d_k", "dim_key",
                     "dim_value"), "head_dim"),
    **dict.fromkeys(("layer_idx", "layer_id", "layer_number", "block_idx"), "layer_idx"),
    # a layer that can compute its own position bias (T5's first layer) is built with it: the oracle
    # adds the layer's table (mha.scoring.PositionBias), so how the layer adds it is verified
    "has_relative_attention_bias": "position_bias",
    # SAM's layers project to hidden_size / downsample_rate: built at full width, as its models'
    # self-attention is (the oracle's heads are d_model / n_head wide)
    "downsample_rate": "one",
}
#: a *required* constructor parameter's name -> what it is given; optional ones keep their defaults
#: (a layer built without bias by default is verified so): the plain layer, no dropout, a context as
#: wide as the input (labml's ``d_cond``)
REQUIRED_ROLES: dict[str, str] = {
    **dict.fromkeys(("is_causal", "causal"), "false"),
    "bias": "true",
    **dict.fromkeys(("dropout", "dropout_prob", "dropout_rate", "attn_dropout", "attention_dropout", "att_drop",
                     "proj_drop", "attn_drop"), "zero"),
    **dict.fromkeys(("d_cond", "context_dim", "dim_context", "d_context", "cross_attention_dim"), "d_model"),
    # a LoRA rank: its up-projection starts at zero (LoRA's own init, kept by the redraw), so any rank
    # builds the same function; 1 is the smallest that builds (labml's lora GPT-2 attention)
    **dict.fromkeys(("r", "lora_r", "lora_rank"), "one"),
    # a fused kernel's switch (LightGlue's ``Attention(allow_flash)``): the plain path, whose steps are read
    **dict.fromkeys(("allow_flash", "use_flash", "flash"), "false"),
    # a longest sequence the layer is built for (memory-efficient-attention's ``CosineSimAttention(seq_len)``
    # sets its scale's start from it; a causal buffer of that size is read as the layer's max_length)
    **dict.fromkeys(("seq_len", "max_seq_len", "max_len", "max_seq_length", "block_size", "n_ctx",
                     "context_length", "max_length"), "length"),
    # a window of positions (MONAI's Swin ``WindowAttention(window_size)``, a local attention's keys per
    # window): 4, or (4, 4) where the annotation says a sequence of sizes; a table sized for the window
    # is read as the layer's (lengths up to 16 then: :mod:`bias_tables`)
    **dict.fromkeys(("window_size", "window", "win_size"), "window"),
}
#: the window a window role gets, one size per axis where the constructor takes a sequence
WINDOW = 4
_SEQUENCE_ANNOTATION = re.compile(r"\b(?:Sequence|tuple|Tuple|list|List)\b")
#: a group norm's group count: where its default divides no small width (labml's ``AttentionBlock(n_groups=32)``
#: at 8 channels), the layer is built again with one group (:func:`plans`)
NORM_GROUP_NAMES = ("n_groups", "num_groups", "norm_num_groups", "norm_groups", "groupnorm_groups")
#: a flag whose default builds no layer (torchscale's ``assert self.self_attention ^
#: self.encoder_decoder_attention``): where no plan builds with it off, each is tried with it on
FLAG_FALLBACKS = ("self_attention",)
#: roles that are not sizes: a plan of these alone names no size of the layer
_NOT_SIZES = ("position_bias", "one", "false", "true", "zero", "length", "window", "windows")
CONFIG_NAMES = ("config", "cfg", "args")
#: a config field -> the size it is set to, where the library's config has the field
CONFIG_ROLES: dict[str, str] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim"), "d_model"),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads"), "n_head"),
    **dict.fromkeys(("d_kv", "kv_channels", "attention_head_size"), "head_dim"),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads"), "kv_heads"),
    "attention_downsample_rate": "one",
}
#: set on every library config whether it has the field or not (layers read it with a fallback)
CONFIG_ALWAYS = ("head_dim",)
#: the attention implementation a transformers layer is built with (the one HF picks by default)
ATTN_IMPLEMENTATION = "sdpa"
#: names of the base classes of library configs (transformers 4.x and 5.x, diffusers)
_CONFIG_BASES = ("PretrainedConfig", "PreTrainedConfig")


def sizes_of(d_model: int, n_head: int, grouped: bool = True) -> dict[str, int]:
    """The value of each role at (d_model, n_head). Key/value heads: half the query heads where
    H is even and ``grouped`` (grouped-query attention gets exercised), else H."""
    return {"d_model": d_model, "n_head": n_head, "head_dim": d_model // n_head, "layer_idx": 0,
            "kv_heads": n_head // 2 if grouped and n_head % 2 == 0 else n_head, "position_bias": True, "one": 1,
            "false": False, "true": True, "zero": 0, "length": 1024, "window": WINDOW}


def role_value(size: dict[str, int], role: str) -> object:
    """What a parameter of ``role`` is given at ``size`` (:func:`sizes_of`): a window per axis for
    "windows", the size otherwise."""
    return (WINDOW, WINDOW) if role == "windows" else size[role]


def _json(value: object) -> object:
    """``value`` as a replay bundle writes a constructor argument: a tuple as ``{"tuple": [...]}``."""
    return {"tuple": list(value)} if isinstance(value, tuple) else value


def _role(p: inspect.Parameter, role: str) -> str:
    """``role``, or "windows" for a window whose annotation is a sequence (``Sequence[int]``)."""
    annotation = p.annotation if isinstance(p.annotation, str) else repr(p.annotation)
    return "windows" if role == "window" and _SEQUENCE_ANNOTATION.search(annotation) else role


def config_for(d_model: int, n_head: int) -> SimpleNamespace:
    """A config namespace for layers of a library with no config class (nanoGPT's
    ``CausalSelfAttention(config)``), with the field names the libraries use.

    Dropout 0; biases on; block size 1024 (nanoGPT's default).
    """
    size = sizes_of(d_model, n_head)
    kv, hd = size["kv_heads"], size["head_dim"]
    return SimpleNamespace(
        n_embd=d_model, hidden_size=d_model, d_model=d_model, dim=d_model, embed_dim=d_model,
        n_head=n_head, num_attention_heads=n_head, num_heads=n_head, n_heads=n_head,
        num_key_value_heads=kv, n_kv_heads=kv, num_kv_heads=kv, head_dim=hd,
        bias=True, attention_bias=True, qkv_bias=True, dropout=0.0, attention_dropout=0.0, attn_pdrop=0.0,
        block_size=1024, max_position_embeddings=1024, is_decoder=False, _attn_implementation="sdpa",
    )


class OpenNamespace(SimpleNamespace):
    """:func:`config_for`'s namespace where any other field reads None (torchscale's ``args.multiway``,
    ``args.xpos_rel_pos``): the library's options off. Tried only where the plain namespace builds nothing."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def _is_config_class(obj: object) -> bool:
    """A library's config class: transformers' and diffusers' by their base, or a dataclass named
    ``*Config`` (kornia's ``MoonViTConfig``, ``PaliGemmaConfig``: every field has a default)."""
    if not inspect.isclass(obj):
        return False
    return any(base.__name__ in _CONFIG_BASES for base in obj.__mro__[1:]) \
        or (dataclasses.is_dataclass(obj) and obj.__name__.endswith("Config")
            and not getattr(getattr(obj, "__dataclass_params__", None), "frozen", False))


def _named_classes(annotation: object, namespace: dict[str, object]) -> list[object]:
    """The classes an annotation names: a class, a union of them, or their names as a string
    (``from __future__ import annotations``), each looked up in ``namespace``, never evaluated."""
    if isinstance(annotation, str):
        for wrapper in ("Optional[", "Union[", "]"):
            annotation = annotation.replace(wrapper, "")
        names = [part.strip().rpartition(".")[2] for part in annotation.replace(",", "|").split("|")]
        return [namespace.get(name) for name in names if name]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return list(typing.get_args(annotation))
    return [annotation]


def _prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def library_configs(cls: type, annotation: object) -> list[type]:
    """The library's config classes for ``cls``'s config parameter, most likely first."""
    namespace = vars(sys.modules[cls.__module__]) if cls.__module__ in sys.modules else {}
    named = [c for c in _named_classes(annotation, namespace) if isinstance(c, type) and _is_config_class(c)]
    if named:
        return named
    held = [c for c in namespace.values() if isinstance(c, type) and _is_config_class(c)]
    # single configs before composite ones (CLIPConfig holds text_config and vision_config)
    return sorted(held, key=lambda c: (bool(getattr(c, "sub_configs", None)), -_prefix(c.__name__, cls.__name__),
                                       c.__name__))


def supports_sdpa(cls: type) -> bool:
    """Whether the models of ``cls``'s module run sdpa: False where the module's own
    ``*PreTrainedModel`` says ``_supports_sdpa = False`` (ALIGN's, BigBird's: their models refuse
    sdpa and run eager), True where it says True or the module has none."""
    namespace = vars(sys.modules[cls.__module__]) if cls.__module__ in sys.modules else {}
    own = [c for name, c in namespace.items() if name.endswith("PreTrainedModel") and name != "PreTrainedModel"
           and isinstance(c, type) and getattr(c, "__module__", "") == cls.__module__]
    return not own or any(getattr(c, "_supports_sdpa", True) is not False for c in own)


def library_config(config_cls: type, d_model: int, n_head: int, grouped: bool = True,
                   sdpa: bool = True) -> object:
    """``config_cls()`` with the sizes set on the fields it has (and ``head_dim``), attention
    implementation :data:`ATTN_IMPLEMENTATION` (eager where ``sdpa`` is False: the layer's
    models do not run sdpa)."""
    config = config_cls()
    size = sizes_of(d_model, n_head, grouped)
    aliases = getattr(config, "attribute_map", None) or {}
    claimed: dict[str, str] = {}  # the config's own field -> the role that set it
    for field, role in CONFIG_ROLES.items():
        if hasattr(config, field):
            own = aliases.get(field, field)
            if claimed.setdefault(own, role) != role:
                # an alias of a field another size set (Voxtral's num_key_value_heads is its
                # num_attention_heads): the layer has kv heads = heads, and the heads stay
                continue
            setattr(config, field, size[role])
    for field in CONFIG_ALWAYS:
        setattr(config, field, size[field])
    if hasattr(config, "_attn_implementation"):
        # sdpa refuses a soft-cap (HF raises "sdpa attention does not support softcap"): such layers
        # run their eager code, as HF's own models pick for them
        softcapped = getattr(config, "attn_logit_softcapping", None) is not None
        config._attn_implementation = "eager" if softcapped or not sdpa else ATTN_IMPLEMENTATION
    return config


@dataclass(frozen=True)
class Construction:
    """How to build one class: keyword arguments by role, a config, or ``Attr(d_model, n_head)``.

    roles: (parameter, role) pairs passed by keyword; empty with ``positional``.
    config: (parameter, config class or None for :func:`config_for`'s namespace), or None.
    """

    cls: type
    roles: tuple[tuple[str, str], ...] = ()
    config: tuple[str, type | None] | None = None
    positional: bool = False
    grouped: bool = True
    #: an attention core (:mod:`attention_core`): the layout of its per-head inputs and how it was read
    core: tuple[str, str] | None = None
    #: the namespace config reads None for any field it lacks (:class:`OpenNamespace`)
    open_config: bool = False

    def namespace(self, d_model: int, n_head: int) -> SimpleNamespace:
        made = config_for(d_model, n_head)
        return OpenNamespace(**vars(made)) if self.open_config else made

    def build(self, d_model: int, n_head: int) -> nn.Module:
        if self.positional:
            return self.cls(d_model, n_head)
        size = sizes_of(d_model, n_head, self.grouped)
        kwargs: dict[str, object] = {name: role_value(size, role) for name, role in self.roles}
        if self.core is not None:
            core = self.cls(**kwargs)
            core_module(core)
            return CoreInProjections(core, d_model, n_head, self.core[0])
        if self.config is not None:
            name, config_cls = self.config
            kwargs[name] = self.namespace(d_model, n_head) if config_cls is None \
                else library_config(config_cls, d_model, n_head, self.grouped, supports_sdpa(self.cls))
        module = self.cls(**kwargs)
        k, v = getattr(module, "k_proj", None), getattr(module, "v_proj", None)
        if self.grouped and isinstance(k, nn.Linear) and isinstance(v, nn.Linear) and k.out_features != v.out_features:
            # Nemotron 3's audio attention sizes v_proj by the query heads, k_proj by the kv heads:
            # only kv heads = heads builds a layer it runs; the next plan builds that
            raise ValueError(f"{self.cls.__name__} with {size['kv_heads']} key/value heads of {n_head}: k_proj gives "
                             f"{k.out_features} features, v_proj {v.out_features}")
        return module

    def recipe(self, d_model: int, n_head: int) -> dict[str, object]:
        """How :meth:`build` builds at (d_model, n_head), as JSON data: the class (module and name),
        positional ``args`` or keyword ``kwargs``, and a ``config`` built from its class's defaults
        with the fields ``set`` (and ``attn_implementation``), or a ``namespace`` of fields. A
        standalone replay builds the same layer from it without this project."""
        where = {"module": self.cls.__module__, "class": self.cls.__qualname__}
        if self.core is not None:
            raise ValueError(f"{self.cls.__name__} is verified inside the harness's projections: no standalone recipe")
        if self.positional:
            return {**where, "args": [d_model, n_head]}
        size = sizes_of(d_model, n_head, self.grouped)
        kwargs = {name: _json(role_value(size, role)) for name, role in self.roles}
        recipe: dict[str, object] = {**where, "kwargs": kwargs}
        if self.config is not None:
            name, config_cls = self.config
            if config_cls is None:
                recipe["config"] = {"param": name, "namespace": dict(vars(config_for(d_model, n_head))),
                                    "others_none": self.open_config}
            else:
                config = library_config(config_cls, d_model, n_head, self.grouped, supports_sdpa(self.cls))
                fields = [f for f in CONFIG_ROLES if hasattr(config, f)] + list(CONFIG_ALWAYS)
                recipe["config"] = {"param": name, "module": config_cls.__module__, "class": config_cls.__qualname__,
                                    "set": {f: getattr(config, f) for f in dict.fromkeys(fields)},
                                    "attn_implementation": getattr(config, "_attn_implementation", None)}
        return recipe

    def describe(self, d_model: int, n_head: int) -> str:
        """The call, in words: ``LlamaAttention(config=LlamaConfig(...sizes...), layer_idx=0)``."""
        if self.positional:
            return f"{self.cls.__name__}({d_model}, {n_head})"
        size = sizes_of(d_model, n_head, self.grouped)
        args = [f"{name}={role_value(size, role)}" for name, role in self.roles]
        if self.core is not None:
            return describe_core(f"{self.cls.__name__}({', '.join(args)})", self.cls, d_model)
        if self.config is not None:
            name, config_cls = self.config
            if config_cls is None:
                args.append(f"{name}=<namespace of size fields" + (", any other None>" if self.open_config else ">"))
            else:
                config = library_config(config_cls, d_model, n_head, self.grouped, supports_sdpa(self.cls))
                fields = [f"{f}={getattr(config, f)}" for f in CONFIG_ROLES if hasattr(config, f)]
                fields += [f"{f}={size[f]}" for f in CONFIG_ALWAYS]
                impl = getattr(config, "_attn_implementation", None)
                args.append(f"{name}={config_cls.__name__}({', '.join(fields)}"
                            + (f"; attention {impl}" if impl else "") + ")")
        return f"{self.cls.__name__}({', '.join(args)})"


def constructor_signature(cls: type) -> inspect.Signature:
    """``cls``'s constructor signature, through a class decorator that wrapped ``__init__`` as
    ``(*args, **kwargs)`` without ``functools.wraps`` (transformers 5.25's ``use_kernelized_func``
    where the ``kernels`` package is installed): the ``__init__`` of the class it closes over."""
    signature = inspect.signature(cls)
    kinds = {p.kind for p in signature.parameters.values()}
    if kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
        init = vars(cls).get("__init__")
        own = f"{cls.__qualname__}.__init__"
        for cell in getattr(init, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if inspect.isfunction(inner) and inner.__qualname__ == own:
                params = list(inspect.signature(inner).parameters.values())[1:]  # without self
                return inspect.Signature(params)
    return signature


def plans(cls: type) -> list[Construction]:
    """The ways to build ``cls``, to be tried in order (one per candidate config class; then each with one
    group for a group norm whose count it takes, :data:`NORM_GROUP_NAMES`; then a namespace config that reads
    None for any other field; then each with a :data:`FLAG_FALLBACKS` flag on)."""
    found = _plans(cls)
    try:
        params = constructor_signature(cls).parameters
    except (TypeError, ValueError):
        return found
    groups = tuple((name, "one") for name, p in params.items() if name in NORM_GROUP_NAMES and p.default is not p.empty)
    if groups:
        found += [dataclasses.replace(plan, roles=plan.roles + groups) for plan in found if not plan.positional]
    found += [dataclasses.replace(plan, open_config=True) for plan in found
              if plan.config is not None and plan.config[1] is None]
    flags = tuple((name, "true") for name, p in params.items() if name in FLAG_FALLBACKS and p.default is False)
    if flags:
        found += [dataclasses.replace(plan, roles=plan.roles + flags) for plan in found if not plan.positional]
    return found


def _plans(cls: type) -> list[Construction]:
    try:
        params = [p for p in constructor_signature(cls).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return [Construction(cls, positional=True)]
    required = [p for p in params if p.default is p.empty]
    if takes_heads(cls) and not any(p.name in PARAMETER_ROLES for p in params) \
            and all(p.name in REQUIRED_ROLES for p in required):
        # an attention core: no size of its own to give (SAM's ``Attention(embedding_dim, num_heads)`` takes
        # q, k, v too, and has its projections), its defaults kept, sizes the harness's projections'
        return [Construction(cls, tuple((p.name, _role(p, REQUIRED_ROLES[p.name])) for p in required),
                             core=core_layout(cls))]
    roles: list[tuple[str, str]] = []
    config: inspect.Parameter | None = None
    unknown: list[str] = []
    for p in params:
        if p.name in PARAMETER_ROLES:
            roles.append((p.name, PARAMETER_ROLES[p.name]))
        elif p.name in CONFIG_NAMES and config is None:
            config = p
        elif p.default is p.empty and p.name in REQUIRED_ROLES:
            roles.append((p.name, _role(p, REQUIRED_ROLES[p.name])))
        elif p.default is p.empty:
            unknown.append(p.name)
    if unknown or (not any(role not in _NOT_SIZES for _, role in roles) and config is None):
        return [Construction(cls, positional=True)]
    if config is None:
        return [Construction(cls, tuple(roles))]
    candidates: list[type | None] = list(library_configs(cls, config.annotation))
    if not candidates:
        # a layer built from a config of no library we know: a namespace where the config is
        # required, the layer's own default where it is optional
        return [Construction(cls, tuple(roles), (config.name, None) if config.default is config.empty else None)]
    # each config grouped first (kv heads = H/2 exercises grouped-query attention), then kv heads = H
    return [Construction(cls, tuple(roles), (config.name, c), grouped=g) for c in candidates for g in (True, False)]


def choose(cls: type, d_model: int, n_head: int) -> tuple[Construction, Callable[[int, int], nn.Module]]:
    """The first plan of :func:`plans` that builds ``cls`` at (d_model, n_head), and its factory;
    the last plan when none does (its error is then the one reported)."""
    options = plans(cls)
    for plan in options[:-1]:
        try:
            plan.build(d_model, n_head)
        except Exception:
            continue
        return plan, plan.build
    return options[-1], options[-1].build


__all__ = [
    "CONFIG_NAMES",
    "CONFIG_ROLES",
    "PARAMETER_ROLES",
    "REQUIRED_ROLES",
    "Construction",
    "choose",
    "config_for",
    "library_config",
    "library_configs",
    "plans",
    "sizes_of",
    "supports_sdpa",
]
