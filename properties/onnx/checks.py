"""Static checks of an attention ONNX model's interface: what is wrong before anything runs."""

from __future__ import annotations

from mha_verify.properties.onnx.interface import Interface


def frozen_axes(info: Interface) -> list[str]:
    """B, Lq or Lk frozen to a number in the graph's inputs, as sentences (empty: all dynamic)."""
    return [f"{label} is fixed to {size} in the graph's inputs" for label, size in zip(("B", "Lq", "Lk"),
            info.fixed_axes, strict=True) if size is not None and not (label == "Lk" and info.self_attention)]


def interface_problems(info: Interface) -> list[str]:
    """What is wrong with the interface of an attention model, as sentences (empty: nothing).

    Catches statically: an input the graph does not read (what torch's dynamo exporter leaves
    when k and v were the same example tensor, pytorch issue 139646) and Lq and Lk sharing one
    dimension symbol (merged by the exporter from equal example sizes). Frozen axes are
    :func:`frozen_axes`: a finding of their own, judged by the caller.
    """
    problems = []
    for role, spec in info.roles.items():
        if spec.name not in info.consumed:
            problems.append(f"input {role} = {spec.name!r} is not read by any node (beyond its shape): another input "
                            "took its place (torch's dynamo exporter does this when two example inputs are the same "
                            "tensor)")
    if problems:
        return problems
    first = info.dims_of("x" if info.self_attention else "q")
    if not info.self_attention:
        lk = info.dims_of("k")[1]
        if isinstance(first[1], str) and first[1] == lk:
            problems.append(f"Lq and Lk are one dimension {lk!r} in the graph: the model rejects or miscomputes "
                            "cross-attention (Lq != Lk); the exporter merged them, e.g. from equal example sizes")
    return problems
