"""``mha-verify merge``: the parts of a sharded ``check`` (their --report files) or ``sweep``
(their sweep.json) as the one report, table and exit code a single run would have given."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from mha_verify.exit_codes import usage_error


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    mp = subparsers.add_parser(
        "merge", help="combine the parts of a sharded check or sweep into one report and one exit code",
        description="Combine the JSON reports of `check --shard I/N` (every I of one N) into the report, JUnit, "
                    "HTML and exit code of a single run; or, with --out, the sweep.json files of `sweep --shard I/N` "
                    "into one sweep table. Exit 0 pass, 1 a check failed or nothing was verified, 2 the parts "
                    "are not one whole run (a shard missing or given twice, another target or version).")
    mp.add_argument("parts", nargs="+", metavar="PART.json", help="the parts' reports (or sweep.json files)")
    mp.add_argument("--report", metavar="FILE.json", default=None, help="write the merged JSON report")
    mp.add_argument("--junit", metavar="FILE.xml", default=None, help="write the merged JUnit XML")
    mp.add_argument("--html", metavar="FILE.html", default=None, help="write the merged HTML report")
    mp.add_argument("--out", metavar="DIR", default=None, help="sweeps: folder for the merged sweep.json and sweep.md")
    mp.set_defaults(func=run_merge)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def run_merge(args: argparse.Namespace) -> int:
    from mha_verify import gate_outputs, merge
    from mha_verify.export.atomic import AtomicWriter
    from mha_verify.sweep import TABLE_FILES

    outputs = {k: getattr(args, k) for k in ("report", "junit", "html", "out") if getattr(args, k) is not None}
    for kind, path in outputs.items():
        if path == "":
            return usage_error(f"--{kind} is an empty path")
        for part in args.parts:  # a merged file never replaces one of its own parts
            written = [os.path.join(path, name) for name in TABLE_FILES] if kind == "out" else [path]
            if any(_same_file(w, part) for w in written):
                return usage_error(f"--{kind} {path!r} is one of the parts being merged; write the merge elsewhere")
    try:
        docs = [(p, merge.read_json(p)) for p in args.parts]
        sweeps = [isinstance(d, dict) and "format" in d for _, d in docs]
        if any(sweeps):
            if not all(sweeps):
                raise ValueError("the parts mix sweep tables and check reports")
            if set(outputs) != {"out"}:
                raise ValueError("sweep tables merge into a folder: give --out DIR (and no --report/--junit/--html)")
            return _merge_sweeps(docs, Path(args.out))
        if "out" in outputs:
            raise ValueError("--out is for sweep tables; check reports merge into --report/--junit/--html")
        merged = merge.merge_checks([merge.read_part(p, d) for p, d in docs])
        writers = {kind: AtomicWriter(path) for kind, path in outputs.items()}
        providers = next(d.get("providers") for _, d in docs)
    except (ValueError, OSError) as exc:
        return usage_error(str(exc))
    print(f"mha-verify: merged {len(docs)} shards of {merged.target} with profile {merged.profile}", file=sys.stderr)
    gate_outputs.print_results(merged.results)
    documents = gate_outputs.render(
        merged.results, list(writers), target=merged.target, profile=merged.profile, seed=merged.seed,
        versions=merged.versions,
        providers=[str(p) for p in providers] if isinstance(providers, list) else None)
    unwritten = gate_outputs.write_all(writers, documents)
    if unwritten:
        return usage_error(f"could not write {', '.join(unwritten)}; the verdicts are printed above")
    return gate_outputs.exit_code(merged.results)


def _merge_sweeps(docs: list[tuple[str, object]], out: Path) -> int:
    from mha_verify import merge
    from mha_verify.folder_lock import hold_folder
    from mha_verify.sweep import check_table_paths, load_previous, write_table
    from mha_verify.sweep_cmd import report

    rows, ctx, build_only = merge.merge_sweeps(docs)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    with hold_folder(out, "--out"):  # a sweep still writing there would overwrite the merge, or lose it
        check_table_paths(out)
        load_previous(out, ctx)  # refuses a folder whose sweep.json is not a sweep's
        command = "mha-verify merge " + " ".join(shlex.quote(p) for p, _ in docs)
        write_table(out, rows, ctx, command)
    return report(rows, out, build_only=build_only)
