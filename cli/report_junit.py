"""JUnit XML for CI systems: one testsuite per stage, one testcase per check."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from mha_verify.escape import printable
from mha_verify.properties.engine.results import CheckResult


def document(results: Sequence[CheckResult], *, target: str) -> bytes:
    """n/a checks are <skipped> with their reason; failures carry the counterexample and replay; a
    finding (or an n/a for one) carries its kind as a testcase property, and its reason in system-out.

    Every string passes through :func:`~mha_verify.escape.printable`: an exception message with
    ANSI colours once made the whole file unparseable."""
    root = ET.Element("testsuites", name=printable(f"mha-verify {target}"))
    for stage in dict.fromkeys(r.stage for r in results):
        rows = [r for r in results if r.stage == stage]
        suite = ET.SubElement(
            root, "testsuite", name=stage, tests=str(len(rows)),
            failures=str(sum(r.failed for r in rows)), errors=str(sum(r.errored for r in rows)),
            skipped=str(sum(r.verdict == "n/a" for r in rows)), time=f"{sum(r.seconds for r in rows):.3f}",
        )
        for r in rows:
            case = ET.SubElement(suite, "testcase", classname=f"mha_verify.{stage}", name=printable(r.name),
                                 time=f"{r.seconds:.3f}")
            if r.kind is not None:
                props = ET.SubElement(case, "properties")
                ET.SubElement(props, "property", name="verdict", value=r.verdict)
                ET.SubElement(props, "property", name="kind", value=r.kind_label or r.kind)
            if r.failed:
                failure = ET.SubElement(case, "failure", message=printable((r.reason or "failed")[:500]),
                                        type="Violation")
                failure.text = printable("\n".join(x for x in (
                    r.reason, f"counterexample: {r.counterexample}" if r.counterexample else None,
                    f"replay: {r.replay}" if r.replay else None) if x))
            elif r.errored:  # mha-verify's own check raised: JUnit's error, not a failure of the target
                error = ET.SubElement(case, "error", message=printable((r.reason or "raised")[:500]),
                                      type="HarnessError")
                error.text = printable(r.reason or "raised")
            elif r.verdict == "n/a":
                ET.SubElement(case, "skipped", message=printable(r.reason or "not applicable"))
            out = ET.SubElement(case, "system-out")
            out.text = printable(str(r))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
