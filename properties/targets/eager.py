"""Targets: load the attention module to verify from a SPEC and bind it to an adapter.

SPEC is ``package.module:Attr`` or ``path/to/file.py:Attr``. Attr is an nn.Module class,
built from its constructor's parameter names (``properties.adapters.construction``: sizes, a layer
index, its library's own config) or as ``Attr(d_model, n_head)``, or a factory
``(d_model, n_head) -> nn.Module``.
The default SPEC is the reference, ``mha_verify.mha:MultiHeadAttention``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import math
import os
import re
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.utils.deterministic
from torch import nn

from mha_verify.mha.reference import MHAParams
from mha_verify.properties.adapters import construction
from mha_verify.properties.adapters.attention_core import CoreInProjections, describe_core, in_projections
from mha_verify.properties.adapters.base import Adapter
from mha_verify.properties.adapters.layout_probe import to_layer
from mha_verify.properties.adapters.library_facts import KNOWN_LIBRARIES, library_of
from mha_verify.properties.adapters.registry import find_adapter
from mha_verify.properties.adapters.signature import read_signature
from mha_verify.properties.adapters.structural import given_none
from mha_verify.properties.adapters.unmodelled import BEYOND
from mha_verify.properties.loading import load_attr
from mha_verify.properties.protocol import Conventions, NotApplicable, TargetError

DEFAULT_SPEC = "mha_verify.mha:MultiHeadAttention"


@contextlib.contextmanager
def uninitialized_as_nan() -> Iterator[None]:
    """Construction with torch's deterministic fill of uninitialized memory: a parameter the constructor
    leaves as ``torch.empty`` (labml's LoRA weight, a checkpoint's to fill) is NaN, not whatever the
    allocator's block held (1e35 once, 0.5 the next time), so :func:`randomize_parameters` knows it has no
    scale of its own. Deterministic algorithms warn only, silenced: nothing here is an op to report."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]


def randomize_parameters(module: nn.Module, seed: int) -> None:
    """Redraw every parameter of ``module``, biases included, from ``seed``, at the scale of its init.

    A layer is checked with the weights it was built with otherwise, and torch MHA, GPT-2 and
    others initialize biases to 0: a bug that swaps the q and k biases, or drops one, is then
    invisible (it failed by 0.49 against 5e-6 allowed once biases were drawn). Each tensor is
    redrawn in place as N(0, s^2) with s its own standard deviation after init (so the layer
    keeps its scale: softmax neither saturates nor flattens more than it would in use); a
    tensor whose init is constant zero (biases) gets the mean scale of the layer's weight
    matrices; one of a constant c != 0 (a norm's ones) is drawn as N(c, (c/2)^2); a constant-zero one
    named other than ``*weight``/``*bias`` (a table, a gate, Transformer-XL's ``u``) stays zero; a tensor
    left uninitialized (NaN under :func:`uninitialized_as_nan`; non-finite, or 1e6 and more) is drawn at
    1 / sqrt(fan-in) (a matrix) or at the matrices' scale: its scale would otherwise be the memory's, and
    differ between two instances of one seed. Buffers
    (causal masks, rotary tables) are left alone. Drawn in the
    parameter's own dtype (float32: 5x faster than drawing float64 and rounding, 22 ms against
    110 ms at d_model 1024).
    """
    # a constant-zero tensor that is no module's weight or bias (a relative-position table, Transformer-XL's
    # u and v, a gate) stays zero: drawn, it is a step the layer never takes at init
    params = [p for name, p in module.named_parameters() if p.is_floating_point()
              and (name.rpartition(".")[2].endswith(("weight", "bias")) or bool(p.detach().ne(0).any()))]
    with torch.no_grad():
        # a tensor left uninitialized (labml's LoRA base weight and bias are torch.empty, to be loaded from a
        # checkpoint) has no scale of its own: its memory's can be 1e35 or NaN. A matrix is drawn at
        # 1 / sqrt(fan-in), as nn.Linear's init would, a vector at the matrices' scale
        garbage = [not bool(torch.isfinite(p).all()) or (p.numel() > 0 and float(p.detach().abs().max()) >= 1e6)
                   for p in params]
        scales = [0.0 if bad or p.numel() < 2 else float(p.detach().float().std())
                  for p, bad in zip(params, garbage, strict=True)]
        scales = [p.shape[-1] ** -0.5 if bad and p.dim() >= 2 else x for p, x, bad in zip(params, scales, garbage,
                                                                                          strict=True)]
        matrix_scales = [x for p, x in zip(params, scales, strict=True) if p.dim() >= 2 and x > 0 and math.isfinite(x)]
        fallback = sum(matrix_scales) / len(matrix_scales) if matrix_scales else 0.02
        generator = torch.Generator().manual_seed(seed * 7919 + 17)
        for p, scale, bad in zip(params, scales, garbage, strict=True):
            s = scale if scale > 0 and math.isfinite(scale) else fallback
            # a constant non-zero init (a norm's ones) is drawn around itself, at half its size: a QK-norm
            # weight drawn near 0 would flatten every score, and a bug in them with it
            level = float(p.detach().float().mean()) if p.numel() and not (scale > 0) and not bad else 0.0
            mean, s = (level, abs(level) / 2) if level and math.isfinite(level) else (0.0, s)
            if p.device.type == "cpu":
                p.normal_(mean, s, generator=generator)
            else:  # a CPU generator draws on the CPU
                p.copy_(torch.empty(p.shape, dtype=p.dtype).normal_(mean, s, generator=generator))


@dataclass
class Bound:
    """An eager module at fixed sizes with the adapter that calls it: the eager
    :class:`~mha_verify.properties.protocol.Instance`."""

    module: nn.Module
    adapter: Adapter
    d_model: int
    n_head: int
    #: a new instance as built (same sizes, seed, dtype): a Target rebuilds it; a module given as it
    #: is (``export.onnx_export.as_bound``) is deep-copied as it was when bound
    rebuild: Callable[[], Bound] | None = field(default=None, repr=False, compare=False)
    #: where a function the layer calls refuses autograd (:func:`grads_refused`), its words: the layer is
    #: then called under ``torch.no_grad()``
    grads_refused: str | None = None
    #: where the layer, of a library the harness has no facts about, raised on masks of some forms as the
    #: harness read its convention (:func:`mask_smoke`): (the types and forms it took, the first error); it is then
    #: given those only, or none, said in its conventions
    mask_refused: tuple[frozenset[str], frozenset[str], str] | None = None
    _float64: Bound | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rebuild is None:
            pristine = copy.deepcopy(self.module)
            refused, mask_refused = self.grads_refused, self.mask_refused
            self.rebuild = lambda: Bound(copy.deepcopy(pristine), self.adapter, self.d_model, self.n_head,
                                         grads_refused=refused, mask_refused=mask_refused)

    @property
    def conventions(self) -> Conventions:
        found = self.adapter.conventions(self.module)
        if self.mask_refused is not None and found.mask:
            kinds, forms, error = self.mask_refused
            said = f"it raised on an all-keep mask of a form the harness read ({error})"
            drawn = f"masks drawn as {'/'.join(sorted(kinds))} {', '.join(sorted(forms))} only"
            found = dataclasses.replace(found, mask=kinds, mask_forms=forms or found.mask_forms,
                                        mask_unsupported=None if kinds else f"{said}: called without one",
                                        notes=(*found.notes, f"{said}: {drawn}" if kinds
                                               else f"{said}: called without a mask"))
        if self.grads_refused is None:
            return found
        return dataclasses.replace(found, grads=False, grads_refused=self.grads_refused, notes=(
            *found.notes, f"called without gradients: a function it calls refuses them ({self.grads_refused})"))

    def _grad_mode(self) -> contextlib.AbstractContextManager[object]:
        return torch.no_grad() if self.grads_refused is not None else contextlib.nullcontext()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, Lq, D), k (B, Lk, D), v (B, Lk, D), our mask convention -> (B, Lq, D)."""
        with self._grad_mode():
            return self.adapter.call(self.module, q, k, v, mask)

    def with_weights(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``__call__``, also returning the weights (B, H, Lq, Lk); NotApplicable if it cannot."""
        with self._grad_mode():
            return self.adapter.call_with_weights(self.module, q, k, v, mask)

    def params(self) -> MHAParams:
        return self.adapter.params(self.module)

    def set_dropout(self, p: float) -> bool:
        return self.adapter.set_dropout(self.module, p)

    def set_training(self, mode: bool) -> None:
        self.module.train(mode)

    def cached(self, x: torch.Tensor, chunks: tuple[int, ...]) -> torch.Tensor:
        with self._grad_mode():
            return self.adapter.cached(self.module, x, chunks)

    def fresh(self) -> Bound:
        assert self.rebuild is not None
        return self.rebuild()

    def implementation(self, name: str) -> Bound:
        """This layer computing through its library's attention implementation ``name`` (transformers'
        ``config._attn_implementation``, which its forward reads at every call): a copy, same weights."""
        module = copy.deepcopy(self.module)
        for sub in module.modules():
            config = sub.__dict__.get("config")
            if config is not None and isinstance(getattr(config, "_attn_implementation", None), str):
                config._attn_implementation = name
        return Bound(module, self.adapter, self.d_model, self.n_head, grads_refused=self.grads_refused,
                     mask_refused=self.mask_refused)

    def in_float64(self) -> Bound:
        """This instance computing in float64: a copy, its weights widened (kept for later calls).
        A layer the oracle does not model is measured against it (``measure.relation_allowed``)."""
        if self._float64 is None:
            wide = copy.deepcopy(self.module).double()
            self._float64 = Bound(wide, self.adapter, self.d_model, self.n_head, rebuild=lambda: self.in_float64(),
                                  grads_refused=self.grads_refused, mask_refused=self.mask_refused)
        return self._float64


PROBE_SIZES = (8, 2)  # (d_model, n_head) where a target's conventions are read before a run


@dataclass
class Target:
    """A loaded SPEC: builds eager instances of any size (the eager
    :class:`~mha_verify.properties.protocol.Subject`)."""

    spec: str
    factory: Callable[[int, int], nn.Module]
    adapter_name: str | None = None
    randomize: bool = True  # redraw every parameter from the seed (see randomize_parameters)
    _pristine: OrderedDict[tuple[int, int, int, torch.dtype], nn.Module] = field(
        default_factory=OrderedDict, repr=False, compare=False)
    _copyable: bool = field(default=True, repr=False, compare=False)
    #: the adapter found for each class the factory built: looked up once, not per example
    _adapters: dict[type, Adapter] = field(default_factory=dict, repr=False, compare=False)
    #: how a class was built, in words (``construction.Construction.describe``); "" for a factory
    built_as: str = ""
    #: how a class is built, as a plan that also gives it as data (a standalone replay's recipe);
    #: None for a factory
    plan: construction.Construction | None = field(default=None, repr=False, compare=False)
    #: where a function the layer calls refuses autograd, its words (:func:`smoke_call`)
    grads_refused: str | None = None
    #: the mask types and forms the layer took where it raised on others as read (:func:`mask_smoke`)
    mask_refused: tuple[frozenset[str], frozenset[str], str] | None = None

    #: built modules kept, untouched, to be copied when the same (d_model, n_head, seed, dtype)
    #: comes again (Hypothesis repeats sizes and seeds while it mutates and shrinks, and
    #: ``Bound.rebuild`` asks for the same module): a copy costs 10 ms at d_model 1024 where
    #: construction and redrawing cost 47 ms (below PRISTINE_MIN_NUMEL parameters, d_model 128
    #: for an MHA layer, copying costs about what building does, and nothing is kept)
    PRISTINE_KEPT = 8
    PRISTINE_MIN_NUMEL = 2**16

    @property
    def probe_sizes(self) -> tuple[int, int]:
        return PROBE_SIZES

    def build(self, d_model: int, n_head: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Bound:
        """Construct the module, redraw all its parameters from ``seed`` at the scale of its init
        (biases included), in eval mode, in ``dtype``.

        Raises TargetError if construction fails or gives something other than an nn.Module.
        """
        key = (d_model, n_head, seed, dtype)
        # the CPU generator only: torch.manual_seed also queues seeds for CUDA and XPU, recording a
        # stack trace each time they are not initialized (1.4 ms a call, 3 s of a ci gate)
        torch.default_generator.manual_seed(seed)  # left as construction would leave it, kept or not
        kept = self._pristine.get(key)
        if kept is not None:
            self._pristine.move_to_end(key)
            return self._bind(copy.deepcopy(kept), d_model, n_head, seed, dtype)
        try:
            with uninitialized_as_nan():
                module = self.factory(d_model, n_head)
        except (Exception, SystemExit) as exc:  # sys.exit() in __init__ is a failure to build, not a green exit
            raise TargetError(
                f"building {self.spec} with (d_model={d_model}, n_head={n_head}) failed: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(module, nn.Module):
            raise TargetError(f"{self.spec} returned {type(module).__name__}, not a torch.nn.Module")
        if self.randomize:
            randomize_parameters(module, seed)
        if any(t.is_floating_point() and t.dtype != dtype for t in (*module.parameters(), *module.buffers())):
            module = module.to(dtype)
        module = module.eval()
        if self._copyable and sum(p.numel() for p in module.parameters()) >= self.PRISTINE_MIN_NUMEL:
            try:
                self._pristine[key] = copy.deepcopy(module)
            except Exception:  # a module holding something that cannot be copied: build every time
                self._copyable = False
                self._pristine.clear()
            while len(self._pristine) > self.PRISTINE_KEPT:
                self._pristine.popitem(last=False)
        return self._bind(module, d_model, n_head, seed, dtype)

    def _bind(self, module: nn.Module, d_model: int, n_head: int, seed: int, dtype: torch.dtype) -> Bound:
        try:
            adapter = self._adapters.get(type(module)) or find_adapter(module, self.adapter_name)
            self._adapters[type(module)] = adapter
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        return Bound(module, adapter, d_model, n_head, lambda: self.build(d_model, n_head, seed=seed, dtype=dtype),
                     grads_refused=self.grads_refused, mask_refused=self.mask_refused)


# a function that says it takes no gradients (FlexAttention on the CPU: "does not support backward on CPU";
# an op without a derivative): not a leaf modified in place, which is the layer's own doing
_AUTOGRAD_REFUSED = re.compile(r"supports? backward|backward (?:is )?not (?:implemented|supported)"
                               r"|derivative for .* is not implemented|not (?:implemented|supported) for autograd",
                               re.IGNORECASE)


def smoke_call(bound: Bound, spec: str) -> str | None:
    """One forward of ``bound`` on a small self-attention example (q = k = v, (2, 3, D), no mask)
    before any property runs: a layer that cannot be called at all is one usage error naming the
    exception, not a FAIL of every property (each costing a search to say the same).

    Then the same forward with autograd on: where only that raises, and says it is autograd that is
    refused (FlexAttention on the CPU: "does not support backward"), the words are returned: a function
    the layer calls takes no gradients here, which is not the layer's defect, and the forward can still be
    verified without them. None otherwise (an error that is the layer's own, such as its input modified in
    place, is left for the properties to find)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, bound.d_model, generator=generator).to(next(
        (p.dtype for p in bound.module.parameters() if p.is_floating_point()), torch.float32))
    try:
        with torch.no_grad():
            bound(x, x, x)
    except NotApplicable:
        return None  # the adapter refuses this call (it is not an error of the layer's)
    except (Exception, SystemExit) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        conv = bound.conventions
        given = next((n for n in conv.notes if n.endswith("given None")), "")
        # a step beyond the oracle leads: often it is why the call fails (a relative table sized for a
        # window, a 6-D window layout), and it is what the layer would be refused for
        step = f" takes {conv.beyond}, a step beyond the attention the oracle models, and" if conv.beyond else ""
        raise TargetError(f"{spec}:{step} one forward at (d_model={bound.d_model}, n_head={bound.n_head}) on q = k "
                          f"= v of shape (2, 3, {bound.d_model}), no mask{f' ({given})' if given else ''}, raised "
                          f"{type(exc).__name__}: {first}{_as_grid(bound, x, exc)}; nothing can be checked") from None
    try:
        bound(x.requires_grad_(), x, x)
    except NotApplicable:
        return None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        if _AUTOGRAD_REFUSED.search(first):
            return f"{type(exc).__name__}: {first}"
    return None  # any other error with autograd on is the layer's, for the properties to find


def _as_grid(bound: Bound, x: torch.Tensor, exc: BaseException) -> str:
    """Where a layer read as batch-first raised on (2, 3, D), what its forward raises on the same sequence as
    one row of a 4-D input, features last (2, 1, 3, D) and channels first (2, D, 1, 3): every call raising, the
    layout probe read nothing, and the error a feature-map layer gives on a map is the one its user needs
    (labml's DDPM block: a view its multi-head path cannot take), not the 3-D call's unpacking error."""
    if bound.conventions.layout != "batch_first" or bound.adapter.name != "by_shape":
        return ""
    said = []
    given = dict.fromkeys(given_none(bound.module))  # as the 3-D call had them: None where no role is read
    first = read_signature(bound.module).input
    for layout in ("B1LD", "BD1L"):
        shape = ", ".join({"B": "2", "L": "3", "1": "1", "D": "D"}[a] for a in layout)
        try:
            with torch.no_grad():
                bound.module.forward(**{first: to_layer(x, layout)}, **given)
        except Exception as other:  # the layer's own error is what is said
            words = (str(other).strip().splitlines() or [""])[0][:160]
            if (type(other), words) != (type(exc), (str(exc).strip().splitlines() or [""])[0][:160]):
                said.append(f"as ({shape}) it raised {type(other).__name__}: {words}")
            continue
        said.append(f"as ({shape}) it runs")
    return f" (as one row of a 4-D input, {'; '.join(said)})" if said else ""


def _cores_wrapped(factory: Callable[[int, int], nn.Module]) -> Callable[[int, int], nn.Module]:
    """``factory``, its module wrapped in the harness's projections where it is an attention core
    (:func:`attention_core.in_projections`): a user's factory for a core is the core's constructor call."""
    def build(d_model: int, n_head: int) -> nn.Module:
        module = factory(d_model, n_head)
        wrapped = in_projections(module, d_model, n_head) if isinstance(module, nn.Module) else None
        return module if wrapped is None else wrapped
    return build


def load_target(spec: str | None = None, *, adapter: str | None = None) -> Target:
    """Resolve SPEC (default: the reference), check that it builds at a small size and that one
    forward runs there (:func:`smoke_call`)."""
    spec = spec or DEFAULT_SPEC
    obj = load_attr(spec)
    built_as = ""
    plan = None
    if inspect.isclass(obj):
        if not issubclass(obj, nn.Module):
            raise TargetError(f"{spec} is a class but not a torch.nn.Module subclass")
        plan, factory = construction.choose(obj, *PROBE_SIZES)
        built_as = plan.describe(*PROBE_SIZES)
    elif callable(obj):
        factory = _cores_wrapped(obj)
    else:
        raise TargetError(f"{spec} is a {type(obj).__name__}, not an nn.Module class or a factory")
    target = Target(spec, factory, adapter, built_as=built_as, plan=plan)
    try:  # fail now, as a usage error, rather than inside every property
        bound = target.build(*PROBE_SIZES)
        conv = bound.conventions
    except ValueError as exc:
        raise TargetError(str(exc)) from None
    windows = [name for name, role in (plan.roles if plan is not None else ()) if role in ("window", "windows")]
    if windows and conv.position_bias is None and conv.window is None:
        # given a window by the harness, where no table sized for it was read (local-attention's LocalMHA
        # attends within buckets of positions): judged as plain attention, every check would fail on it
        steps = f" (besides, it takes {conv.beyond})" if conv.beyond else ""
        raise TargetError(f"{spec} built as {built_as}: its window of positions ({', '.join(windows)}) is one that "
                          f"no table or window the harness reads accounts for{steps}, {BEYOND}")
    if plan is None and isinstance(bound.module, CoreInProjections):
        target.built_as = describe_core(f"{spec} -> {type(bound.module.core).__name__}", type(bound.module.core),
                                        bound.d_model)
    target.grads_refused = smoke_call(bound, spec)
    target.mask_refused = mask_smoke(bound)
    return target


#: an all-keep mask of each form (B = 2, H = 2 at most, Lq = Lk = 3), as the strategies draw them
_KEEP_SHAPES = {"B1LL": (2, 1, 3, 3), "11LL": (1, 1, 3, 3), "LL": (3, 3), "BHLL": (2, 0, 3, 3), "B11L": (2, 1, 1, 3)}


def mask_smoke(bound: Bound) -> tuple[frozenset[str], frozenset[str], str] | None:
    """One forward with an all-keep mask of each form and type the harness would draw, in the convention it
    read, for a layer of a library it has no facts about: where a form raises with every type and the call
    without a mask did not (:func:`smoke_call`), the reading of its shape is what is wrong far more often
    than the layer (conformer's token mask (B, N), perceiver's experimental (B * H, N, 1)): (the types,
    the forms it took, the first error), and the harness draws only those forms, or no mask at all, said in
    its conventions. A layer of a library the harness
    knows is called with the mask its models pass, and one declaring its mask is held to its declaration:
    there the same error is the layer's, for the properties to find. None where every form runs."""
    conv = bound.conventions
    declared = dict(getattr(bound.module, "mha_verify_conventions", None) or {})
    ours = any(cls.__module__.startswith("mha_verify.") for cls in type(bound.module).__mro__)
    if not conv.mask or conv.mask_lengths or library_of(bound.module) in KNOWN_LIBRARIES or ours \
            or {"mask", "mask_forms"} & set(declared):  # a convention stated, not read: held to it
        return None
    x = torch.randn(2, 3, bound.d_model, generator=torch.Generator().manual_seed(0))
    x = x.to(next((p.dtype for p in bound.module.parameters() if p.is_floating_point()), torch.float32))
    ran: dict[tuple[str, str], bool] = {}
    first = ""
    for kind in sorted(conv.mask):
        for form in (f for f in _KEEP_SHAPES if f in conv.mask_forms):
            shape = tuple(bound.n_head if n == 0 else n for n in _KEEP_SHAPES[form])
            mask = torch.ones(shape, dtype=torch.bool) if kind == "bool" else torch.zeros(shape, dtype=x.dtype)
            try:
                with torch.no_grad():
                    bound(x, x, x, mask)
                ran[kind, form] = True
            except NotApplicable:
                ran[kind, form] = True
            except Exception as exc:
                ran[kind, form] = False
                first = first or (f"{kind} {form}: {type(exc).__name__}: "
                                  f"{(str(exc).strip().splitlines() or [''])[0][:160]}")
    # a form is dropped where every type raised on it: a type that raises where another runs is the
    # layer's (a float mask handed to masked_fill), for the properties to find
    forms = frozenset(f for f in _KEEP_SHAPES if any(ran.get((k, f)) for k in conv.mask))
    if forms == frozenset(f for f in _KEEP_SHAPES if f in conv.mask_forms):
        return None
    return (conv.mask if forms else frozenset()), forms, first


def load_weights(bound: Bound, path: str | os.PathLike[str], dtype: torch.dtype) -> None:
    """Load a state_dict file into ``bound``'s module (``torch.load(weights_only=True)``: no code
    from the file runs), then cast it to ``dtype`` in eval mode. TargetError (usage) naming the
    file and what is wrong."""
    file = Path(path)
    if not file.is_file():
        raise TargetError(f"weights file {str(file)!r} does not exist")
    try:
        bound.module.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise TargetError(f"cannot load weights {str(file)!r}: {type(exc).__name__}: {first}") from None
    bound.module.to(dtype).eval()


@dataclass
class Fixed:
    """A Subject of one instance already built (an exported module, one loaded with its weights):
    ``build`` returns it at its own sizes, whatever the seed, and refuses other sizes."""

    instance: Bound
    spec: str

    @property
    def probe_sizes(self) -> tuple[int, int]:
        return (self.instance.d_model, self.instance.n_head)

    def build(self, d_model: int, n_head: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Bound:
        if (d_model, n_head) != self.probe_sizes:
            raise TargetError(f"{self.spec} is fixed to (d_model, n_head)={self.probe_sizes}; "
                              f"asked for ({d_model}, {n_head})")
        return self.instance
