"""mha: the reference multi-head attention module and pure reference formulas.

``MultiHeadAttention`` is the module under contract; ``mha_verify.mha.reference`` holds the formulas
(float64 oracle, packed and per-head formulations) that the property suite holds it against.
"""

from mha_verify.mha.module import MultiHeadAttention
from mha_verify.mha.reference import MHAParams, attention, multi_head, per_head


def params_of(module: MultiHeadAttention) -> MHAParams:
    """The projection weights of the reference module as an :class:`MHAParams`."""
    return MHAParams(
        module.w_q.weight, module.w_q.bias, module.w_k.weight, module.w_k.bias,
        module.w_v.weight, module.w_v.bias, module.w_o.weight, module.w_o.bias,
    )


__all__ = ["MHAParams", "MultiHeadAttention", "attention", "multi_head", "params_of", "per_head"]
