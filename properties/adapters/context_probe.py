"""Whether a layer takes the context its forward declares, read by calling it once with and once without.

A forward with an optional context (``forward(x, context=None)``) is drawn as cross-attention, keys and
values through the context, q = k = v included. Some layers accept the argument only when built for it:
vit-pytorch's LookViT ``Attention`` asserts ``not (exists(context) ^ self.cross_attend)``, so as built with
its defaults any context raises and every call of the harness's would. Where the call with the context
raises and the call without it runs, the layer is verified as the self-attention it was built for, and its
conventions say why; where both run or both raise, nothing changes (the second is the load check's to report).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable

import torch
from torch import nn

_READ: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def context_refused(module: nn.Module, context: str, input_name: str, run: Callable[[bool], object]) -> str:
    """The words saying that ``module`` refuses its optional ``context`` as built, or "" where it takes it
    (or it is required, or both calls raise). ``run(with_context)`` calls its forward on x (2, 3, D) in its
    layout, with ``context`` = x or without it. Read once per module, in eval mode with torch's random state
    restored; never inside a trace."""
    if module in _READ:
        return _READ[module]
    if torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing():
        return ""
    try:
        param = inspect.signature(type(module).forward).parameters.get(context)
    except (TypeError, ValueError):
        param = None
    if param is None or param.default is param.empty:
        _READ[module] = ""
        return ""
    alone, given = _raised(module, run, False), _raised(module, run, True)
    words = "" if alone is not None or given is None else (
        f"forward({input_name}, {context}=x) raised {type(given).__name__}{': ' + str(given) if str(given) else ''} "
        f"where forward({input_name}) runs: built for self-attention, verified as self-attention ({context} not "
        "given)")
    _READ[module] = words
    return words


def _raised(module: nn.Module, run: Callable[[bool], object], with_context: bool) -> Exception | None:
    training = module.training
    try:
        module.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            run(with_context)
    except Exception as exc:  # the layer's own error is the reading
        return exc
    finally:
        module.train(training)
    return None


__all__ = ["context_refused"]
