"""ONNX files as targets: their interface read (``interface``, ``model_file``, ``conventions``),
heads and weights recovered from the graph (``heads``, ``weights``, ``reading``), probed
(``probe``), checked (``checks``), and run in onnxruntime (``ort_target``).

Public API: :func:`ort_targets` (one :class:`OrtTarget` per provider) and :func:`read_interface`.
"""

from mha_verify.properties.onnx.interface import read_interface
from mha_verify.properties.onnx.ort_target import OrtTarget, ort_targets

__all__ = ["OrtTarget", "ort_targets", "read_interface"]
