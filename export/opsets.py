"""Which ONNX opsets an export can target: the newest that torch, onnx and onnxruntime share.

The floor is 17 for the TorchScript exporter and 18 for the dynamo one: asked for 17, torch
2.13's dynamo exporter writes opset 18, tries onnx's version converter, fails on
``ReduceMax``'s axes input and silently keeps the model at 18. The ceiling is the smallest
of

* torch's ceiling for the exporter (the dynamo exporter writes up to
  ``torch.onnx._constants.ONNX_MAX_OPSET``, the TorchScript one up to
  ``ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET``),
* the newest opset the installed ``onnx`` knows (``onnx.defs.onnx_opset_version()``),
* the newest opset for which onnxruntime registers a CPU kernel of the default domain.

Opset 23 and later have the standard ``Attention`` operator; torch's dynamo exporter lowers
``F.scaled_dot_product_attention`` to it by itself at those opsets, so an export at the
newest opset uses it without anything on our side.
"""

from __future__ import annotations

import functools

_MIN_BY_EXPORTER = {"dynamo": 18, "torchscript": 17}
ATTENTION_OP_OPSET = 23
EXPORTERS = ("dynamo", "torchscript")

# Used when onnxruntime cannot list its kernels (minimal builds): its documented floor.
_ORT_FALLBACK_MAX = 21


def torch_max_opset(exporter: str) -> int:
    """The newest opset torch's ``exporter`` writes."""
    from torch.onnx import _constants

    if exporter == "dynamo":
        return int(_constants.ONNX_MAX_OPSET)
    if exporter == "torchscript":
        return int(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 20))
    raise ValueError(f"exporter must be one of {EXPORTERS}, got exporter={exporter!r}")


@functools.cache
def ort_max_opset() -> int:
    """The newest default-domain opset for which onnxruntime has a CPU kernel."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as _state

        kernels = _state.get_all_opkernel_def()
    except (ImportError, AttributeError):
        return _ORT_FALLBACK_MAX
    since = [k.version_range[0] for k in kernels if k.domain in ("", "ai.onnx")
             and k.provider == "CPUExecutionProvider"]
    return max(since) if since else _ORT_FALLBACK_MAX


def newest_opset(exporter: str) -> int:
    """The newest opset that torch's ``exporter``, onnx and onnxruntime support together."""
    import onnx

    return min(torch_max_opset(exporter), int(onnx.defs.onnx_opset_version()), ort_max_opset())


def oldest_opset(exporter: str) -> int:
    """The oldest opset ``exporter`` really writes (17 for torchscript, 18 for dynamo)."""
    if exporter not in _MIN_BY_EXPORTER:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got exporter={exporter!r}")
    return _MIN_BY_EXPORTER[exporter]


def supported_opsets(exporter: str) -> range:
    """Opsets from :func:`oldest_opset` to :func:`newest_opset` for ``exporter``."""
    return range(oldest_opset(exporter), newest_opset(exporter) + 1)


def default_opset(exporter: str) -> int:
    """The opset an export uses when none is asked for: the newest supported one."""
    return newest_opset(exporter)


def check_opset(exporter: str, opset: int | None) -> int:
    """``opset`` (or the default) after checking it is supported; ValueError naming the range."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got exporter={exporter!r}")
    if opset is None:
        return default_opset(exporter)
    ok = supported_opsets(exporter)
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in ok:
        raise ValueError(
            f"opset={opset!r} is not supported by the {exporter} exporter here; choose {ok.start}..{ok.stop - 1}"
        )
    return opset
