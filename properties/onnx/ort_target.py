"""An onnxruntime session as a target: the property registry runs against ONNX models as it
runs against eager modules (one protocol, one runner, one isolation path).

* :class:`OrtInstance` is the session's :class:`~mha_verify.properties.protocol.Instance`: q, k,
  v (or x) and the mask are mapped to the model's input names, and the mask is converted to
  the model's type (bool keep-mask or additive float), rank and static axes. Its parameters
  are the graph's initializers (:func:`params_from_graph`) or an eager module's.
* :class:`OrtTarget` is its :class:`~mha_verify.properties.protocol.Subject`: one per
  (provider, optimization level), a target *variant*; ``build`` returns the one session for
  the model's fixed sizes.

What a session cannot do is n/a by declaration, not by failure: no gradients
(``grads=False``), no dropout to switch (``dropout=False``), no attention weights
(``weights=False``), no torch modes (``torch_modes=False``); its sizes and dtype are fixed by
the model (``sizes``, ``dtype``), and masks are generated only in the forms its mask input
takes (``mask_forms``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import torch

from mha_verify.mha.reference import MHAParams
from mha_verify.mha.scoring import PositionBias
from mha_verify.properties.adapters.mask_convert import to_kind, to_shape
from mha_verify.properties.onnx.conventions import rotary_from
from mha_verify.properties.onnx.interface import Interface, read_interface
from mha_verify.properties.onnx.model_file import ModelError
from mha_verify.properties.onnx.weights import projection_weights
from mha_verify.properties.protocol import Conventions, NotApplicable, TargetError

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
OPT_LEVELS = {"opt-none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "opt-all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def available_providers() -> list[str]:
    """Short names (cpu, cuda, tensorrt) of the providers this onnxruntime build offers."""
    have = set(ort.get_available_providers())
    return [short for short, long in PROVIDERS.items() if long in have]


def make_session(path: str | os.PathLike[str], provider: str = "cpu", opt: str = "opt-all", *, threads: int = 1,
                 log_level: int = 4) -> ort.InferenceSession:
    """A session on ``path``; ``threads`` intra-op threads (1 suits validation's small inputs).

    ``log_level`` 4 (fatal only): a shape the model refuses is reported as a check's failure, not
    logged; 2 (warnings) is what :func:`mha_verify.export.onnx_export.export_onnx` asserts silent.
    """
    if provider not in PROVIDERS or opt not in OPT_LEVELS:
        raise ValueError(f"provider must be one of {', '.join(PROVIDERS)} and opt one of {', '.join(OPT_LEVELS)}, "
                         f"got provider={provider!r}, opt={opt!r}")
    so = ort.SessionOptions()
    so.graph_optimization_level = OPT_LEVELS[opt]
    so.log_severity_level = log_level
    so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=[PROVIDERS[provider]])


class OrtInstance:
    """``instance(q, k, v, mask=None) -> out (B, Lq, D)`` computed by an onnxruntime session.

    q (B, Lq, D), k (B, Lk, D), v (B, Lk, D) in our convention; mask None, a bool keep-mask
    (True = may attend) or an additive float mask broadcasting to (B, H, Lq, Lk). A
    self-attention model (one input x) takes q only and requires k and v to equal it.
    Raises NotApplicable for a call the model's interface cannot express (a head-axis mask
    for a (B, 1, Lq, Lk) mask input, finite float biases for a bool mask input, a mask for
    a model without one); onnxruntime's own errors propagate (they are the finding).
    """

    def __init__(self, info: Interface, session: ort.InferenceSession, params: MHAParams) -> None:
        assert info.d_model is not None and info.n_head is not None
        self.info = info
        self.session = session
        self._params = params
        self._np_dtype = {torch.float32: np.float32, torch.float16: np.float16,
                          torch.float64: np.float64}[info.dtype]
        # the inputs of the last call, in our convention: a failed check's reproduction bundle
        # replays the last call of its shrunk counterexample (Hypothesis runs that one last)
        self.last: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        self._conventions = self._read_conventions()

    @property
    def d_model(self) -> int:
        assert self.info.d_model is not None
        return self.info.d_model

    @property
    def n_head(self) -> int:
        assert self.info.n_head is not None
        return self.info.n_head

    @property
    def conventions(self) -> Conventions:
        return self._conventions

    def _read_conventions(self) -> Conventions:
        """Read from the model's interface: mask type and forms, self-attention, sizes, dtype.

        ``fully_masked`` and ``causal`` are declared (``validate --conventions``), else the
        file's (metadata, then its attention operators' attributes), else our contract
        ("zeros", not causal): a foreign model is held to the contract.
        """
        info = self.info
        forms = info.mask_forms if info.mask is not None else Conventions().mask_forms
        stated = info.conventions
        layer = info.layer_scoring  # the eager layer's norms and bias table, when validated beside it
        table = layer.bias if layer is not None and layer.bias is not None and not layer.bias.alibi else None
        return Conventions(
            mask=info.mask_types, mask_forms=forms,
            cross_attention=not info.self_attention, weights=False,
            kv_shared=info.conventions.get("kv_shared", ("false", ""))[0] == "true",
            rotary=rotary_from(info.conventions["rotary"][0]) if "rotary" in info.conventions else None,
            fully_masked=info.conventions.get("fully_masked", ("zeros", ""))[0],
            rows_unspecified=("what a fully masked row gives is left to the runtime ("
                              + {"declared": "declared with --conventions"}.get(
                                  info.conventions["rows_unspecified"][1], "stated in the file's metadata") + ")"
                              if info.conventions.get("rows_unspecified", ("false", ""))[0] == "true" else None),
            causal={"true": "top_left", "bottom_right": "bottom_right"}.get(
                info.conventions.get("causal", ("false", ""))[0], False),
            scale=float(info.conventions["scale"][0]) if "scale" in info.conventions else None,
            softcap=float(stated["softcap"][0]) if "softcap" in stated else None,
            window=int(stated["window"][0]) if "window" in stated else None,
            position_bias=PositionBias(alibi=True, source="the eager target") if "alibi" in stated else table,
            q_norm=None if layer is None else layer.q_norm, k_norm=None if layer is None else layer.k_norm,
            v_norm=None if layer is None else layer.v_norm,
            input_norm=None if layer is None else layer.input_norm,
            context_norm=None if layer is None else layer.context_norm,
            grads=False, dropout=False, torch_modes=False,
            sizes=(self.d_model, self.n_head), dtype=info.dtype, axes=info.fixed_axes,
            notes=(f"onnxruntime session on {info.path.name}",),
        )

    def params(self) -> MHAParams:
        return self._params

    def _mask_feed(self, mask: torch.Tensor | None, B: int, Lq: int, Lk: int) -> np.ndarray:
        """The mask in the model's kind, axes and static sizes (all-keep when ``mask`` is None)."""
        spec = self.info.mask
        assert spec is not None
        labels = self.info.reading.mask_axes
        axes = self.info.mask_axes()  # per (B, H, Lq, Lk): 1 where the model fixes the axis to 1
        full = (axes[0] != 1, axes[1] != 1, axes[2] != 1, axes[3] != 1)
        # the (B, H, Lq, Lk) axes the input keeps; a B*H axis keeps B and H, then merges them
        kept = tuple(i for i, name in enumerate(("B", "H", "Lq", "Lk"))
                     if name in labels or (name in ("B", "H") and "B*H" in labels))
        sizes = (B, self.info.n_head or 1, Lq, Lk)
        m = torch.ones((1, 1, 1, 1), dtype=torch.bool) if mask is None else mask
        m = to_shape(m, sizes, full, kept, what=f"the model's mask input {spec.describe()}")
        if "B*H" in labels:  # (B, H, Lq, Lk) -> (B*H, Lq, Lk): item b, head h at row b*H + h
            m = m.expand(B, sizes[1], m.shape[2], m.shape[3]).reshape(B * sizes[1], m.shape[2], m.shape[3])
        kind = self.info.reading.mask_kind
        assert kind is not None
        takes = self.info.mask_types  # an int32/int64 mask takes 0/1, as a bool one
        m = to_kind(m, kind, self.info.dtype, takes=takes)
        return np.ascontiguousarray(m.detach().cpu().numpy().astype(spec.dtype, copy=False))

    def feed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             mask: torch.Tensor | None) -> dict[str, np.ndarray]:
        """The session's input dict for a call in our convention."""
        roles = self.info.roles
        dt = self._np_dtype

        def arr(t: torch.Tensor) -> np.ndarray:  # (B, L, D) -> the model's layout
            t = t.transpose(0, 1) if self.info.seq_first else t
            return np.ascontiguousarray(t.detach().cpu().numpy().astype(dt, copy=False))

        if self.info.self_attention:
            if not (q is k is v or (q.shape == k.shape == v.shape and torch.equal(q, k) and torch.equal(k, v))):
                raise NotApplicable("the model is self-attention only: one input x")
            out = {roles["x"].name: arr(q)}
        else:
            out = {roles["q"].name: arr(q), roles["k"].name: arr(k), roles["v"].name: arr(v)}
        if self.info.mask is None:
            if mask is not None:
                raise NotApplicable("the model takes no mask")
            return out
        out[self.info.mask.name] = self._mask_feed(mask, q.shape[0], q.shape[1], k.shape[1])
        return out

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        self.last = (q, k, v, mask)
        for name, size, got_size in zip(("B", "Lq", "Lk"), self.info.fixed_axes, (q.shape[0], q.shape[1], k.shape[1]),
                                        strict=True):
            if size is not None and got_size != size:  # a derived call (one item, a prefix) the model cannot take
                raise NotApplicable(f"the model fixes {name} to {size}; this call has {name}={got_size}")
        got = torch.from_numpy(np.asarray(self.session.run([self.info.output], self.feed(q, k, v, mask))[0]))
        return got.transpose(0, 1) if self.info.seq_first and got.dim() == 3 else got  # (L, B, D) -> (B, L, D)

    def with_weights(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotApplicable("an onnxruntime session does not return attention weights")

    def set_dropout(self, p: float) -> bool:
        return False

    def set_training(self, mode: bool) -> None:
        """A session computes the same in any mode (``torch_modes=False``)."""

    def cached(self, x: torch.Tensor, chunks: tuple[int, ...]) -> torch.Tensor:
        raise NotApplicable("this session has no KV-cache inputs (past keys and values) to run it by")

    def fresh(self) -> OrtInstance:
        """The same session (it keeps no state between runs) with its own copy of the parameters."""
        return OrtInstance(self.info, self.session, self._params.to(self._params.w_q.dtype))


def params_from_graph(info: Interface, *, max_external_bytes: int | None = None) -> MHAParams:
    """The projections read from the model's initializers (external data up to ``max_external_bytes``);
    ModelError (usage) if they cannot be told."""
    found = projection_weights(info.path, info, max_external_bytes=max_external_bytes)
    if found is None:
        raise ModelError(f"cannot find the four (D, D) projections of {info.path.name} among its initializers; "
                         "pass --weights FILE (the layer's state_dict) with --target SPEC")
    t = {k: torch.from_numpy(np.array(v)) for k, v in found.items()}
    return MHAParams(t["w_q"], t.get("b_q"), t["w_k"], t.get("b_k"), t["w_v"], t.get("b_v"), t["w_o"], t.get("b_o"))


@dataclass
class OrtTarget:
    """One (model, provider, optimization level): the session's Subject.

    ``build`` returns the same instance for the model's own (d_model, n_head), whatever
    ``seed`` (the weights are the model's); ``dtype`` is ignored, the session computes in the
    model's dtype (the runner asks for it through ``Conventions.dtype``).
    """

    info: Interface
    params: MHAParams
    provider: str = "cpu"
    opt: str = "opt-all"
    threads: int = 1

    def __post_init__(self) -> None:
        if self.info.d_model is None or self.info.n_head is None:
            raise ModelError(f"cannot tell d_model and n_head of {self.info.path.name} "
                             f"(d_model={self.info.d_model}, n_head={self.info.n_head}); pass --d-model and --n-head")
        self._instance: OrtInstance | None = None

    @property
    def spec(self) -> str:
        return f"{self.info.path.name}[{self.provider},{self.opt}]"

    @property
    def probe_sizes(self) -> tuple[int, int]:
        assert self.info.d_model is not None and self.info.n_head is not None
        return (self.info.d_model, self.info.n_head)

    def build(self, d_model: int, n_head: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> OrtInstance:
        if (d_model, n_head) != self.probe_sizes:
            raise TargetError(f"{self.spec} is fixed to (d_model, n_head)={self.probe_sizes}; "
                              f"asked for ({d_model}, {n_head})")
        if self._instance is None:
            session = make_session(self.info.path, self.provider, self.opt, threads=self.threads)
            self._instance = OrtInstance(self.info, session, self.params)
        return self._instance


def ort_targets(path: str | os.PathLike[str], *, providers: tuple[str, ...] | list[str] = ("cpu",),
                opt_levels: tuple[str, ...] | list[str] = tuple(OPT_LEVELS), mapping: dict[str, str] | None = None,
                d_model: int | None = None, n_head: int | None = None, params: MHAParams | None = None,
                ) -> list[OrtTarget]:
    """One OrtTarget per (provider, optimization level) on the model at ``path``.

    ``params`` default to the graph's initializers (:func:`params_from_graph`).
    """
    info = read_interface(path, mapping=mapping, d_model=d_model, n_head=n_head)
    p = params if params is not None else params_from_graph(info)
    return [OrtTarget(info, p, provider, opt) for provider in providers for opt in opt_levels]
