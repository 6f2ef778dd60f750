"""An ONNX model file seen from outside: its interface, and onnxruntime sessions on it.

``ModelInterface`` reads the graph's inputs, outputs and metadata without running it;
``interface_problems`` lists what is wrong with them (the static half of catching the
export pitfalls); ``OrtModel`` holds one session per (provider, optimization level) and
feeds it inputs in our convention.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
OPT_LEVELS = {"opt-none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "opt-all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
_ELEM_DTYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
                onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.BOOL: np.bool_}


class ModelError(Exception):
    """The file is missing, not ONNX, or not an attention model we can feed (a usage error)."""


def available_providers() -> list[str]:
    """Short names (cpu, cuda, tensorrt) of the providers this onnxruntime build offers."""
    have = set(ort.get_available_providers())
    return [short for short, long in PROVIDERS.items() if long in have]


Dim = int | str | None  # a fixed size, a symbol, or unknown


@dataclass
class InputInfo:
    name: str
    dtype: type
    dims: list[Dim]


@dataclass
class ModelInterface:
    """The inputs, first output and metadata of an attention model file."""

    path: Path
    inputs: dict[str, InputInfo]
    output: str
    metadata: dict[str, str]
    consumed: set[str] = field(default_factory=set)  # graph inputs whose values some node (or output) reads
    optional: set[str] = field(default_factory=set)  # inputs with a default initializer

    @property
    def dtype(self) -> type:
        return self.inputs["q"].dtype if "q" in self.inputs else np.float32

    @property
    def d_model(self) -> int | None:
        if "d_model" in self.metadata:
            return int(self.metadata["d_model"])
        d = self.inputs["q"].dims[-1] if "q" in self.inputs and self.inputs["q"].dims else None
        return d if isinstance(d, int) else None

    @property
    def n_head(self) -> int | None:
        if "n_head" in self.metadata:
            return int(self.metadata["n_head"])
        mask = self.inputs.get("mask")
        h = mask.dims[1] if mask is not None and len(mask.dims) == 4 else None
        return h if isinstance(h, int) and h > 1 else None

    @property
    def config(self) -> str:
        """``exporter-opsetN-dtype`` from our metadata, else the file's stem."""
        m = self.metadata
        if {"exporter", "opset", "dtype"} <= m.keys():
            return f"{m['exporter']}-opset{m['opset']}-{m['dtype']}"
        return self.path.stem


def _dims(value: onnx.ValueInfoProto) -> list[Dim]:
    out: list[Dim] = []
    for d in value.type.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    return out


def read_interface(path: str | os.PathLike[str]) -> ModelInterface:
    """Read ``path``'s interface; ModelError (one line) if it is missing or not ONNX."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError, RuntimeError) as exc:
        raise ModelError(f"{str(path)!r} is not an ONNX model: {type(exc).__name__}: {exc}") from None
    if not model.graph.node or not model.graph.output:
        raise ModelError(f"{str(path)!r} is not an ONNX model (no graph)")
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name: InputInfo(i.name, _ELEM_DTYPES.get(i.type.tensor_type.elem_type, object), _dims(i))
              for i in model.graph.input}
    # read for their values: a Shape node reads only the shape (what is left of an input
    # whose place another input took)
    consumed = ({name for node in model.graph.node if node.op_type != "Shape" for name in node.input}
                | {o.name for o in model.graph.output})
    return ModelInterface(
        path, inputs, model.graph.output[0].name, {p.key: p.value for p in model.metadata_props},
        consumed & set(inputs), inits & set(inputs),
    )


def interface_problems(info: ModelInterface) -> list[str]:
    """What is wrong with the interface of an attention model, as sentences (empty: nothing).

    Catches statically: a missing or unused q/k/v input (what torch's dynamo exporter leaves
    when k and v were the same example tensor, pytorch issue 139646; the TorchScript
    exporter drops unused inputs), Lq and Lk sharing one dimension symbol (merged by the
    exporter from equal example sizes), and B, Lq or Lk frozen to a number.
    """
    problems = []
    for name in ("q", "k", "v"):
        if name not in info.inputs:
            problems.append(f"the graph has no input {name!r} (inputs: {', '.join(info.inputs) or 'none'}); "
                            "an exporter drops an input it found unused, e.g. when k and v were one example tensor")
        elif name not in info.consumed:
            problems.append(f"input {name!r} is not read by any node (beyond its shape): another input took its place "
                            "(torch's dynamo exporter does this when two example inputs are the same tensor)")
    if problems:
        return problems
    q, k, v = (info.inputs[n].dims for n in ("q", "k", "v"))
    if len(q) != 3 or len(k) != 3 or len(v) != 3:
        return [f"q, k and v must have rank 3 (B, L, D), got dims q={q}, k={k}, v={v}"]
    for label, dim in (("B", q[0]), ("Lq", q[1]), ("Lk", k[1])):
        if isinstance(dim, int):
            problems.append(f"{label} is fixed to {dim} in the graph's inputs; it must be dynamic")
    if isinstance(q[1], str) and q[1] == k[1]:
        problems.append(f"Lq and Lk are one dimension {q[1]!r} in the graph: the model rejects or miscomputes "
                        "cross-attention (Lq != Lk); the exporter merged them, e.g. from equal example sizes")
    return problems


class OrtModel:
    """Sessions on one model file, created once per (provider, optimization level) and reused."""

    def __init__(self, path: str | os.PathLike[str], info: ModelInterface | None = None, *, threads: int = 1) -> None:
        """``threads``: onnxruntime's intra-op threads; 1 suits validation's small inputs (0 = all cores)."""
        self.path = Path(path)
        self.threads = threads
        self.info = info or read_interface(path)
        self._sessions: dict[tuple[str, str], ort.InferenceSession] = {}

    def session(self, provider: str, opt: str) -> ort.InferenceSession:
        key = (provider, opt)
        if key not in self._sessions:
            so = ort.SessionOptions()
            so.graph_optimization_level = OPT_LEVELS[opt]
            so.log_severity_level = 4  # fatal only: a refused shape is reported as a result
            so.intra_op_num_threads = self.threads
            self._sessions[key] = ort.InferenceSession(str(self.path), so, providers=[PROVIDERS[provider]])
        return self._sessions[key]

    def feed(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray | None) -> dict[str, np.ndarray]:
        """The input dict for q, k, v (model dtype) and a bool keep-mask (rank 4, broadcasting) or None.

        With no mask: an optional mask input is left out; a required one gets all-True.
        The mask is broadcast along any axis whose declared dim is not ours (``mask_*``) or 1,
        so models with a full (B, H, Lq, Lk) mask input are fed correctly.
        Raises ValueError if the model cannot take this mask (no mask input, a non-bool one).
        """
        dt = self.info.dtype
        out: dict[str, np.ndarray] = {
            "q": q.astype(dt, copy=False), "k": k.astype(dt, copy=False), "v": v.astype(dt, copy=False)}
        spec = self.info.inputs.get("mask")
        if spec is None:
            if keep is not None and not keep.all():
                raise ValueError("the model has no mask input")
            return out
        if keep is None:
            if "mask" in self.info.optional:
                return out
            keep = np.ones((1, 1, 1, 1), dtype=np.bool_)
        full = (q.shape[0], self.n_head_for_feed(), q.shape[1], k.shape[1])
        if spec.dims and len(spec.dims) == 4:
            target = tuple(
                keep.shape[i] if (isinstance(d, str) and d.startswith("mask_")) else
                (1 if d == 1 else full[i])
                for i, d in enumerate(spec.dims)
            )
            if any(t == 1 and s != 1 for t, s in zip(target, keep.shape, strict=True)):
                raise ValueError(f"the model's mask input {spec.dims} cannot take a mask of shape {keep.shape}")
            keep = np.broadcast_to(keep, target)
        if spec.dtype is np.bool_:
            out["mask"] = np.ascontiguousarray(keep)
        elif spec.dtype in (np.float32, np.float16, np.float64):
            out["mask"] = np.where(keep, 0.0, -np.inf).astype(spec.dtype)
        else:
            raise ValueError(f"cannot feed a mask to an input of type {spec.dtype}")
        return out

    def n_head_for_feed(self) -> int:
        h = self.info.n_head
        return h if h is not None else 1

    def run(self, provider: str, opt: str, feed: dict[str, np.ndarray]) -> np.ndarray:
        """The first output for ``feed``."""
        return self.session(provider, opt).run([self.info.output], feed)[0]
