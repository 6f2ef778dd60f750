"""What the gate prints, writes and exits with, from its results: shared by ``check`` and by
``merge`` (which must give the very verdicts, documents and exit code of the single run)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mha_verify.escape import printable
from mha_verify.exit_codes import verdicts_exit
from mha_verify.properties.engine.results import CheckResult


def print_results(results: Sequence[CheckResult]) -> None:
    """The table, the failures and the summary line, on stdout."""
    from mha_verify import report_text

    print(printable(report_text.table(results)))
    print(printable(report_text.failures(results)))
    found = report_text.findings(results)
    if found:
        print(printable(found))
    print(printable(report_text.summary(results)))


def render(results: Sequence[CheckResult], kinds: Sequence[str], *, target: str, profile: str, seed: int | None,
           versions: Mapping[str, str] | None = None, providers: Sequence[str] | None = None,
           shard: dict[str, Any] | None = None) -> dict[str, bytes]:
    """The documents of ``kinds`` ("report", "junit", "html"), every one rendered before any is written:
    a renderer's error leaves no file. ``versions`` and ``providers`` default to this machine's."""
    from mha_verify import report_html, report_json, report_junit

    documents: dict[str, bytes] = {}
    if "report" in kinds:
        doc = report_json.document(results, target=target, profile=profile, seed=seed, shard=shard)
        if versions is not None:
            doc["versions"] = dict(versions)
        if providers is not None:
            doc["providers"] = list(providers)
        documents["report"] = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
    if "junit" in kinds:
        documents["junit"] = report_junit.document(results, target=target)
    if "html" in kinds:
        documents["html"] = report_html.document(
            results, target=target, profile=profile,
            versions=dict(versions) if versions is not None else report_json.versions()).encode("utf-8")
    return documents


def write_all(writers: Mapping[str, Any], documents: Mapping[str, bytes]) -> list[str]:
    """Write each document through its AtomicWriter; the files that could not be written, each
    with its reason (a full disk), after the others were written."""
    unwritten = []
    for kind, data in documents.items():
        try:
            writers[kind].write_bytes(data)
        except OSError as exc:
            unwritten.append(f"{writers[kind].path} ({exc.strerror or exc})")
    return unwritten


def exit_code(results: Sequence[CheckResult]) -> int:
    """1 if a check failed or none was verified (said on stderr: that is never a pass), 3 if a check of
    mha-verify raised and none failed, else 0."""
    return verdicts_exit(results)
