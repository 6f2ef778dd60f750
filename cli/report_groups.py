"""Group failures that share one root cause, so a report shows the cause once.

Today one rule: a target that gives NaN on fully masked rows fails ``fully_masked_rows`` and,
through the same NaN, every other check whose examples contain such a row (oracle agreement,
batch independence, the ONNX validations...). When ``fully_masked_rows`` failed, every other
failure whose output was not finite is listed under it as "same cause".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from mha_verify.properties.engine.results import CheckResult

ROOT = "fully_masked_rows"
# NaN or inf as a value, never the "-inf" or "0/-inf" of a mask's wording
_NOT_FINITE = re.compile(r"(?<![-/\w])(?:nan|inf)\b|not finite|non-finite", re.IGNORECASE)
# failures with a cause of their own, whatever numbers they mention: the call contract (shape,
# dtype, inputs changed), an exception, a crash or hang of the check, gradients
_OWN_CAUSE = re.compile(r"^(?:output contract|the target raised|the target called sys\.exit|the check itself raised|"
                        r"timed out|the worker process|gradcheck)")


def as_float(value: object) -> float | None:
    """A float from a result field that may have been through JSON ("inf", "nan"); None if absent."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def not_finite(result: CheckResult) -> bool:
    """True when the failure is a NaN or infinite output: by its reason or its worst error, unless
    the failure has a cause of its own (an exception, the call contract, gradients)."""
    reason = result.reason or ""
    if _OWN_CAUSE.match(reason) or result.name.rsplit("/", 1)[-1] in ("gradcheck", "masked_grad_zero"):
        return False
    error = as_float(result.worst_error)
    return (error is not None and not math.isfinite(error)) or bool(_NOT_FINITE.search(reason))


def group_failures(results: Iterable[CheckResult]) -> list[tuple[CheckResult, list[CheckResult]]]:
    """Failures as (root, same-cause failures), in the order of the roots.

    If ``fully_masked_rows`` failed, the other failures whose output was not finite (see
    ``not_finite``) are its same-cause list; every other failure is a root with an empty list.

    >>> a = CheckResult("fully_masked_rows", "properties", "fail", reason="output gives NaN")
    >>> b = CheckResult("oracle_agreement", "properties", "fail", worst_error=float("inf"))
    >>> [(root.name, [r.name for r in same]) for root, same in group_failures([b, a])]
    [('fully_masked_rows', ['oracle_agreement'])]
    """
    failed = [r for r in results if r.failed]
    root = next((r for r in failed if r.name == ROOT), None)
    same = [r for r in failed if root is not None and r is not root and not_finite(r)]
    return [(r, same if r is root else []) for r in failed if not any(r is s for s in same)]
