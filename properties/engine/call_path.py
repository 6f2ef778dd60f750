"""The one call path: every call of a target by a property goes through :class:`Checked`.

The runner hands each property its instance wrapped here, so the output contract is checked
in one place for every property, eager module and onnxruntime session alike (as PyTorch's
OpInfo harness checks every operator's outputs in one place rather than per test):

* the output of ``instance(q, k, v, mask)`` is a tensor of shape (B, Lq, D), of q's dtype (or
  the dtype the target declares, ``output_dtype``) and on q's device;
* the weights of ``with_weights`` are (B, H, Lq, Lk);
* q, k, v and the mask are bitwise unchanged by the call (a layer that writes into its inputs
  was caught only by luck, when a later call reused the changed tensor).

A breach is a :class:`~mha_verify.properties.engine.measure.Violation` named "output contract", its
own failure, never mistaken for a numeric one.

A target that raises on non-contiguous inputs (a ``.view()`` of its input, as HF's Conv1D
does) but not on contiguous copies of them has not computed a wrong answer: the call is
:class:`~mha_verify.properties.protocol.NotApplicable` with that reason, so the example counts
as unchecked rather than failing every property a third of whose examples are views.

An exception raised while the target runs — its construction, forward, backward or cache — is
marked here as the target's (:func:`target_side`): the runner makes it the check's failure. Any
other exception is raised by mha-verify's own check, and is an error of the run, never a verdict
on the target (:func:`raised_by_target`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from mha_verify.mha.reference import MHAParams
from mha_verify.properties.engine.measure import Violation
from mha_verify.properties.protocol import Conventions, Instance, NotApplicable


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _output(out: object, q: torch.Tensor, d_model: int, declared: torch.dtype | None, what: str = "output"
            ) -> torch.Tensor:
    __tracebackhide__ = True
    if not isinstance(out, torch.Tensor):
        raise Violation(f"output contract: the target returned {type(out).__name__}, not a tensor")
    want = (q.shape[0], q.shape[1], d_model)
    if what == "output" and tuple(out.shape) != want:
        raise Violation(f"output contract: output shape {tuple(out.shape)}, but should be (B, Lq, D) = {want}")
    dtype = q.dtype if declared is None else declared
    if out.dtype != dtype:
        why = "the dtype the target declares" if declared is not None else "the dtype of its inputs"
        raise Violation(f"output contract: {what} dtype {_name(out.dtype)} for {_name(q.dtype)} inputs, but should be "
                        f"{_name(dtype)} ({why}; declare output_dtype if that is intended)")
    if out.device != q.device:
        raise Violation(f"output contract: {what} on device {out.device}, but the inputs are on {q.device}")
    return out


_TARGET_MARK = "_mha_verify_raised_by_target"


@contextlib.contextmanager
def target_side() -> Iterator[None]:
    """Run the target's own code (construction, forward, backward): an exception raised inside is
    marked as the target's, with its type and message unchanged (a property may catch the
    ValueError a layer raises on bad input)."""
    try:
        yield
    except (Violation, NotApplicable):
        raise
    except Exception as exc:
        with contextlib.suppress(AttributeError, TypeError):  # an exception type that takes no attribute
            setattr(exc, _TARGET_MARK, True)
        raise


def raised_by_target(exc: BaseException) -> bool:
    """Whether ``exc`` is the target's failure (a Violation a check measured, or an exception the
    target raised under :func:`target_side`) rather than an exception of mha-verify's own check."""
    return isinstance(exc, Violation) or bool(getattr(exc, _TARGET_MARK, False))


def _snapshot(*inputs: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    return tuple(None if t is None else t.detach().clone() for t in inputs)


def _unchanged(before: tuple[torch.Tensor | None, ...], *inputs: torch.Tensor | None) -> None:
    __tracebackhide__ = True
    for name, old, new in zip(("q", "k", "v", "mask"), before, inputs, strict=True):
        if old is None or new is None:
            continue
        same = (old == new.detach()) | (torch.isnan(old) & torch.isnan(new.detach())) if old.is_floating_point() \
            else old == new.detach()
        if not bool(same.all()):
            raise Violation(f"output contract: the call changed its input {name} in place; inputs must be left "
                            "bitwise unchanged")


_T = TypeVar("_T")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _called(fn: Callable[..., _T], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            mask: torch.Tensor | None) -> _T:
    """``fn(q, k, v, mask)``; where it raises on non-contiguous inputs and not on contiguous copies
    of them, NotApplicable naming the error."""
    try:
        with target_side():
            return fn(q, k, v, mask)
    except (Violation, NotApplicable):
        raise
    except Exception as exc:
        if all(t is None or t.is_contiguous() for t in (q, k, v, mask)):
            raise
        dense = [None if t is None else t.contiguous() for t in (q, k, v, mask)]
        if q is k or q is v:  # one tensor in several roles stays one tensor
            dense[1] = dense[0] if k is q else dense[1]
            dense[2] = dense[0] if v is q else dense[2]
        try:
            fn(*dense)
        except Exception:
            raise exc from None
        raise NotApplicable(f"the target raises on non-contiguous inputs and not on contiguous copies "
                            f"({type(exc).__name__}: {_first_line(exc)})") from None


class Checked:
    """An :class:`~mha_verify.properties.protocol.Instance` whose every call is checked against
    the output contract; everything else is the wrapped instance's."""

    def __init__(self, inner: Instance) -> None:
        self.inner = inner

    @property
    def d_model(self) -> int:
        return self.inner.d_model

    @property
    def n_head(self) -> int:
        return self.inner.n_head

    @property
    def conventions(self) -> Conventions:
        return self.inner.conventions

    def params(self) -> MHAParams:
        return self.inner.params()

    def in_float64(self) -> Instance:
        """The wrapped instance computing in float64 (:meth:`targets.eager.Bound.in_float64`);
        NotApplicable where it has no such form (an onnxruntime session)."""
        widen = getattr(self.inner, "in_float64", None)
        if widen is None:
            raise NotApplicable("laws only: the target has no float64 forward to measure its rounding against")
        with target_side():
            return Checked(widen())

    def implementation(self, name: str) -> Checked:
        """The wrapped instance computing through its library's attention implementation ``name``
        (:meth:`targets.eager.Bound.implementation`); NotApplicable where it has no such form."""
        other = getattr(self.inner, "implementation", None)
        if other is None:
            raise NotApplicable(f"the target cannot be run through another attention implementation ({name})")
        with target_side():
            return Checked(other(name))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        before = _snapshot(q, k, v, mask)
        out = _called(self.inner, q, k, v, mask)
        _unchanged(before, q, k, v, mask)
        return _output(out, q, self.d_model, self.conventions.output_dtype)

    def with_weights(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        before = _snapshot(q, k, v, mask)
        out, weights = _called(self.inner.with_weights, q, k, v, mask)
        _unchanged(before, q, k, v, mask)
        want = (q.shape[0], self.n_head, q.shape[1], k.shape[1])
        if not isinstance(weights, torch.Tensor) or tuple(weights.shape) != want:
            got = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
            raise Violation(f"output contract: attention weights {got}, but should be (B, H, Lq, Lk) = {want}")
        declared = self.conventions.output_dtype
        return _output(out, q, self.d_model, declared), _output(weights, q, self.d_model, declared, "weights")

    def set_dropout(self, p: float) -> bool:
        with target_side():
            return self.inner.set_dropout(p)

    def set_training(self, mode: bool) -> None:
        with target_side():
            self.inner.set_training(mode)

    def cached(self, x: torch.Tensor, chunks: tuple[int, ...]) -> torch.Tensor:
        before = _snapshot(x, x, x, None)
        with target_side():
            out = self.inner.cached(x, chunks)
        _unchanged(before, x, x, x, None)
        return _output(out, x, self.d_model, self.conventions.output_dtype)

    def fresh(self) -> Checked:
        with target_side():
            return Checked(self.inner.fresh())


def weights_if_any(instance: Instance, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``instance.with_weights(...)`` where the target can give weights, else None."""
    if not instance.conventions.weights:
        return None
    try:
        return instance.with_weights(q, k, v, mask)
    except NotApplicable:
        return None
