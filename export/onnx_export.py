"""Export an attention target to ONNX with torch's dynamo or TorchScript exporter.

``export_onnx`` writes a model whose interface :mod:`mha_verify.export.wrapper` documents (q, k, v, a
required broadcastable bool mask, or none in a mask-free graph; ``out`` first), with B, Lq
and Lk dynamic and independent, checked by ``onnx.checker`` (full check) and strict shape
inference, carrying metadata (d_model, n_head, the conventions, the mha-verify version), and
written atomically after a session loaded it without a warning (:func:`session_warnings`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.metadata
import io
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import nn

from mha_verify.export.atomic import atomic_path
from mha_verify.export.contrib_graph import GRAPH_LABEL, OPERATOR, contrib_model
from mha_verify.export.graph_fixes import SELF_SOURCES, refresh_shapes, relax_mask_input, resource_mask_dims
from mha_verify.export.opsets import ATTENTION_OP_OPSET, check_opset
from mha_verify.export.wrapper import ExportWrapper, MaskFreeWrapper, SelfAttentionWrapper, example_inputs, mask_heads
from mha_verify.mha.masks import causal_word
from mha_verify.properties.adapters.registry import find_adapter
from mha_verify.properties.targets.eager import Bound

INPUT_NAMES = ("q", "k", "v", "mask")
OUTPUT_NAME = "out"
MASK_CONVENTION = ("bool keep-mask (True = may attend), rank 4, each axis 1 or (B, H, Lq, Lk); "
                   "(1, 1, 1, 1) True = no mask")
NO_MASK_CONVENTION = "none: a mask-free graph (inputs q, k, v)"
DTYPES = {"float32": torch.float32, "float16": torch.float16}
GRAPHS = ("torch", GRAPH_LABEL)
# Ranges declared for the dynamic dims (dynamo); the graphs themselves have no upper bound.
_MAX_BATCH, _MAX_LEN = 1 << 16, 1 << 20


class ExportError(Exception):
    """The export, or a check of the exported model, failed; nothing was written."""


@dataclass(frozen=True)
class ExportInfo:
    """What was written: the file, the exporter, the opset, the dtype and how long it took."""

    path: Path
    exporter: str
    opset: int
    dtype: torch.dtype
    d_model: int
    n_head: int
    seconds: float

    @property
    def label(self) -> str:
        """e.g. ``dynamo-opset23-float32``, the prefix of validation check names."""
        return model_label(self.exporter, self.opset, self.dtype)


def model_label(exporter: str, opset: int, dtype: torch.dtype) -> str:
    return f"{exporter}-opset{opset}-{str(dtype).replace('torch.', '')}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def as_bound(obj: Bound | nn.Module, *, d_model: int | None = None, n_head: int | None = None) -> Bound:
    """A Bound for ``obj``: itself, or a module bound to the adapter that recognizes it.

    For a plain module, d_model and n_head default to its ``d_model`` / ``n_head``
    attributes (or ``embed_dim`` / ``num_heads``, torch.nn.MultiheadAttention's names).
    """
    if isinstance(obj, Bound):
        return obj
    if not isinstance(obj, nn.Module):
        raise TypeError(f"expected a mha_verify.properties.targets.eager.Bound or a torch.nn.Module, "
                        f"got {type(obj).__name__}")
    d = d_model if d_model is not None else getattr(obj, "d_model", getattr(obj, "embed_dim", None))
    h = n_head if n_head is not None else getattr(obj, "n_head", getattr(obj, "num_heads", None))
    if not isinstance(d, int) or not isinstance(h, int):
        raise ValueError(f"cannot tell d_model and n_head of {type(obj).__name__}: pass d_model= and n_head=")
    return Bound(obj.eval(), find_adapter(obj), d, h)


def _in_dtype(bound: Bound, dtype: torch.dtype) -> Bound:
    """The bound target in ``dtype`` (a copy if it is in another dtype), in eval mode."""
    first = next(iter(bound.module.parameters()), None)
    module = bound.module
    if first is not None and first.dtype != dtype:
        module = copy.deepcopy(module).to(dtype)
    return dataclasses.replace(bound, module=module.eval(), rebuild=None)


def _innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of ``exc``'s chain of causes (``__cause__``, else ``__context__``)."""
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ or exc.__context__
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def _names(args: tuple[torch.Tensor, ...]) -> list[str]:
    """Graph input names: q, k, v[, mask], or x[, mask] for a self-attention export (1 or 2 inputs)."""
    if len(args) <= 2:
        return list(("x", "mask")[:len(args)])
    return list(INPUT_NAMES[:len(args)])


def _dynamo(wrapper: nn.Module, args: tuple[torch.Tensor, ...], opset: int) -> onnx.ModelProto:
    batch = torch.export.Dim("batch", min=1, max=_MAX_BATCH)
    lq = torch.export.Dim("lq", min=1, max=_MAX_LEN)
    lk = torch.export.Dim("lk", min=1, max=_MAX_LEN)
    shapes = {"q": {0: batch, 1: lq}, "k": {0: batch, 1: lk}, "v": {0: batch, 1: lk},
              "mask": {0: batch, 2: lq, 3: lk}}
    if len(args) <= 2:  # self-attention: x (B, L, D), mask (B, H, L, L)
        shapes = {"x": {0: batch, 1: lq}, "mask": {0: batch, 2: lq, 3: lq}}
    names = _names(args)
    program = torch.onnx.export(
        wrapper, args, None, dynamo=True, opset_version=opset, dynamic_shapes={n: shapes[n] for n in names},
        input_names=names, output_names=[OUTPUT_NAME], verbose=False,
    )
    if program is None:  # pragma: no cover - dynamo=True with f=None always returns a program
        raise ExportError("torch.onnx.export returned no program")
    return program.model_proto


def _torchscript(wrapper: nn.Module, args: tuple[torch.Tensor, ...], opset: int) -> onnx.ModelProto:
    buf = io.BytesIO()
    axes = {"q": {0: "batch", 1: "lq"}, "k": {0: "batch", 1: "lk"}, "v": {0: "batch", 1: "lk"},
            "mask": {0: "batch", 2: "lq", 3: "lk"}, OUTPUT_NAME: {0: "batch", 1: "lq"}}
    if len(args) <= 2:  # self-attention: x (B, L, D), mask (B, H, L, L)
        axes = {"x": {0: "batch", 1: "lq"}, "mask": {0: "batch", 2: "lq", 3: "lq"}, OUTPUT_NAME: {0: "batch", 1: "lq"}}
    names = _names(args)
    torch.onnx.export(
        wrapper, args, buf,  # type: ignore[arg-type]  # torch documents file objects for the TorchScript exporter
        dynamo=False, opset_version=opset, input_names=names,
        output_names=[OUTPUT_NAME], dynamic_axes={n: axes[n] for n in [*names, OUTPUT_NAME]},
    )
    return onnx.load_from_string(buf.getvalue())


def _trace(bound: Bound, exporter: str, opset: int, dtype: torch.dtype, device: torch.device | str,
           mask_input: bool) -> onnx.ModelProto:
    """The target traced by torch's ``exporter`` through the wrapper (ExportError if torch fails)."""
    bound.module.to(device)
    wrapper: nn.Module = (ExportWrapper(bound) if mask_input else MaskFreeWrapper(bound)).eval()
    args: tuple[torch.Tensor, ...] = example_inputs(bound.d_model, bound.n_head, dtype=dtype, device=device)
    if mask_heads(bound) == 1:  # no per-head mask: the example mask (B, H, Lq, Lk) -> (B, 1, Lq, Lk)
        args = (*args[:3], args[3][:, :1])
    if not mask_input:
        args = args[:3]
    # one input x (B, L, D), and a (B, H, L, L) mask if it takes one; a target taking keys and values
    # as one argument is exported as its self-attention graph too (no (q, kv) graph is written yet)
    if not bound.conventions.cross_attention or bound.conventions.kv_shared:
        takes_mask = mask_input and bool(bound.conventions.mask)
        wrapper = SelfAttentionWrapper(bound, with_mask=takes_mask).eval()
        x, mask = args[0], args[3] if len(args) > 3 else None
        args = (x, mask[..., :, :x.shape[1]]) if takes_mask and mask is not None else (x,)
    # TorchScript traces with autograd on, as a plain torch.onnx.export does: under no_grad
    # torch.nn.MultiheadAttention (q is k is v, batch_first) takes its fast path, whose
    # aten::_native_multi_head_attention has no TorchScript symbolic (UnsupportedOperatorError)
    grad = torch.no_grad() if exporter == "dynamo" else torch.enable_grad()
    try:
        with warnings.catch_warnings(), grad:
            warnings.simplefilter("ignore")
            proto = (_dynamo if exporter == "dynamo" else _torchscript)(wrapper, args, opset)
    except Exception as exc:
        cause = _innermost(exc)  # torch wraps the real cause in generic "Next steps" text
        raise ExportError(f"torch.onnx.export ({exporter}, opset {opset}) failed: {type(cause).__name__}: "
                          f"{str(cause).strip().splitlines()[0] if str(cause).strip() else ''}") from exc
    written = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if written != opset:
        raise ExportError(f"asked the {exporter} exporter for opset {opset}, it wrote opset {written}")
    return proto


def set_metadata(model: onnx.ModelProto, values: dict[str, str]) -> None:
    """Set (replace) ``metadata_props`` entries."""
    keep = [p for p in model.metadata_props if p.key not in values]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in values.items():
        model.metadata_props.add(key=key, value=value)


@contextlib.contextmanager
def _stderr_to(path: Path):  # type: ignore[no-untyped-def]
    """Redirect file descriptor 2 (where onnxruntime's C++ logger writes) to ``path``."""
    saved = os.dup(2)
    try:
        with open(path, "wb") as f:
            os.dup2(f.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def session_warnings(path: str | os.PathLike[str]) -> list[str]:
    """What onnxruntime logs at level warning (and above) while loading ``path`` on the CPU provider."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 2  # warning
    with tempfile.TemporaryDirectory(prefix="mha-verify-log-") as tmp:
        log = Path(tmp) / "stderr.txt"
        with _stderr_to(log):
            ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        return [line for line in log.read_text(errors="replace").splitlines() if line.strip()]


def export_onnx(
    target: Bound | nn.Module,
    path: str | os.PathLike[str],
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    dtype: torch.dtype = torch.float32,
    d_model: int | None = None,
    n_head: int | None = None,
    device: torch.device | str = "cpu",
    target_spec: str | None = None,
    mask_input: bool = True,
    graph: str = "torch",
) -> ExportInfo:
    """Export ``target`` to ONNX at ``path`` (atomically) and return what was written.

    Args:
        target: a Bound (from ``Target.build``) or an nn.Module that an adapter recognizes;
            either way it is exported through :class:`mha_verify.export.wrapper.ExportWrapper`, in our
            calling convention.
        exporter: "dynamo" (``torch.export`` with ``Dim``\\ s) or "torchscript" (tracing with
            ``dynamic_axes``).
        opset: 17 .. :func:`mha_verify.export.opsets.newest_opset`; default the newest. At opset >= 23
            the dynamo exporter lowers attention to the ONNX ``Attention`` operator.
        dtype: torch.float32 or torch.float16; the model's inputs and output have this dtype.
        device: where the module and example inputs live while tracing ("cuda" for a GPU
            export; the graph is device-independent).
        mask_input: True (default): a required ``mask`` input; False: a mask-free graph with
            inputs q, k, v only, for deployments that never mask (no mask work at run time).
        graph: "torch" (default): what ``exporter`` traces from the target's code, standard
            ONNX; "ort-contrib": onnxruntime's fused ``com.microsoft.MultiHeadAttention``
            built from the target's parameters (:mod:`mha_verify.export.contrib_graph`; onnxruntime only,
            labelled in the metadata; ``exporter`` and ``opset`` are then ignored).
    Raises:
        ValueError / TypeError for bad arguments; ExportError if torch fails to export or the
        model fails ``onnx.checker``/shape inference. Nothing is written then.
    """
    if dtype not in DTYPES.values():
        raise TypeError(f"dtype must be one of {', '.join(DTYPES)}, got dtype={dtype}")
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {GRAPHS}, got graph={graph!r}")
    bound = _in_dtype(as_bound(target, d_model=d_model, n_head=n_head), dtype)
    start = time.perf_counter()
    extra: dict[str, str] = {}
    if graph == GRAPH_LABEL:
        exporter, opset = GRAPH_LABEL, 18
        proto = contrib_model(bound.params(), bound.d_model, bound.n_head, dtype=dtype, mask_input=mask_input)
        extra = {"graph": GRAPH_LABEL, "graph_operator": OPERATOR,
                 "graph_note": "not standard ONNX: runs in onnxruntime only; the reference formula with the "
                               "target's parameters"}
    else:
        opset = check_opset(exporter, opset)
        proto = _trace(bound, exporter, opset, dtype, device, mask_input)
        extra = {"graph": "standard"}
    try:
        has_mask = any(i.name == "mask" for i in proto.graph.input)
        if has_mask and graph != GRAPH_LABEL:
            self_attention = any(i.name == "x" for i in proto.graph.input)
            heads = mask_heads(bound)  # H, or 1 for a target that takes no per-head mask
            resource_mask_dims(proto, heads, sources=SELF_SOURCES if self_attention else None)
            relax_mask_input(proto)
            if heads == 1:  # the head axis stays 1: onnxruntime validation then feeds shared masks only
                next(i for i in proto.graph.input if i.name == "mask").type.tensor_type.shape.dim[1].dim_value = 1
        proto = refresh_shapes(proto)
        set_metadata(proto, {
            "d_model": str(bound.d_model), "n_head": str(bound.n_head),
            "mask_convention": MASK_CONVENTION if has_mask else NO_MASK_CONVENTION,
            "fully_masked": bound.conventions.fully_masked, "conventions": bound.conventions.describe(),
            "causal": causal_word(bound.conventions.causal),
            "exporter": exporter, "opset": str(opset),
            "dtype": dtype_name(dtype), "torch_version": torch.__version__, "mha_verify_version": _our_version(),
            "target": target_spec or f"{type(bound.module).__module__}.{type(bound.module).__qualname__}",
            "onnx_attention_op": str(any(n.op_type == "Attention" for n in proto.graph.node)).lower(),
            **extra,
        })
        onnx.checker.check_model(proto, full_check=True)
    except (ValueError, onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"the exported model ({exporter}, opset {opset}) is invalid: {exc}") from exc
    with atomic_path(path) as tmp:
        onnx.save_model(proto, tmp)
        onnx.checker.check_model(str(tmp), full_check=True)  # what is on disk, not only in memory
        logged = session_warnings(tmp)
        if logged:
            raise ExportError(f"onnxruntime logs warnings loading the exported model: {' | '.join(logged)[:500]}")
    return ExportInfo(Path(path), exporter, opset, dtype, bound.d_model, bound.n_head, time.perf_counter() - start)


__all__ = [
    "ATTENTION_OP_OPSET",
    "DTYPES",
    "GRAPHS",
    "ExportError",
    "ExportInfo",
    "as_bound",
    "export_onnx",
    "model_label",
    "session_warnings",
]


def _our_version() -> str:
    """The installed mha-verify's version, read from its metadata (the CLI layer above holds it too)."""
    try:
        return importlib.metadata.version("mha-verify")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
