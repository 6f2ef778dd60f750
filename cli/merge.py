"""The parts of a sharded run put back together: the report one run would have written.

A part is the JSON report of ``mha-verify check --shard I/N --report PART.json``. Its ``shard``
block names every task of the whole run in the single run's order (``tasks``) and, for its own
tasks, how many results each gave (``mine``: ``[[name, count], ...]``, in the part's order).
:func:`merge_checks` checks that the parts are one run's (same target, profile, seed, versions
and task list; every index 1..N exactly once; every task in exactly one part) and returns the
results in the single run's order. Reports are users' files: read as data, every field checked,
and a part that does not fit is a ValueError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mha_verify import json_files
from mha_verify.properties.engine.results import CheckResult
from mha_verify.shards import Shard

#: a part larger than this is refused before it is parsed (a report of the whole suite is ~1 MB)
MAX_PART_BYTES = 256 * 1024 * 1024
#: what must be equal in every part of one run
SAME = ("target", "profile", "seed", "versions")


@dataclass(frozen=True)
class Part:
    """One shard's report, checked."""

    path: str
    index: int
    count: int
    tasks: tuple[str, ...]
    mine: tuple[tuple[str, int], ...]
    header: dict[str, Any]
    results: tuple[CheckResult, ...]


@dataclass(frozen=True)
class Merged:
    target: str
    profile: str
    seed: int | None
    versions: dict[str, str]
    results: list[CheckResult]


def read_json(path: str) -> Any:
    """The JSON document at ``path``, or a ValueError naming the file."""
    return json_files.read_json(path, what=repr(path), max_bytes=MAX_PART_BYTES)


def _int(value: object, what: str, least: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}"[:200])
    if least is not None and value < least:
        raise ValueError(f"{what} must be at least {least}, got {value}")
    return value


def _shard(block: dict[str, Any]) -> Shard:
    """The part's ``index``/``count``, in the bounds ``--shard`` itself has (a count of 10**18
    would have the missing shards listed one by one)."""
    return Shard(_int(block.get("index"), "shard.index"), _int(block.get("count"), "shard.count"))


def _number(x: object) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) or x in ("inf", "-inf", "nan")


def check_details(details: dict[str, Any]) -> None:
    """The ``details`` the reports render have the shapes the runner writes (a part is a user's
    file: a string where a list belongs must be a usage error, not a renderer's traceback)."""
    ratios = details.get("error_ratios", [])
    if not isinstance(ratios, list) or not all(_number(x) for x in ratios):
        raise ValueError("details.error_ratios must be a list of numbers")
    notes = details.get("hypothesis", [])
    if not isinstance(notes, list) or not all(isinstance(x, str) for x in notes):
        raise ValueError("details.hypothesis must be a list of strings")
    heatmap = details.get("heatmap")
    if heatmap is not None:
        weights = heatmap.get("weights") if isinstance(heatmap, dict) else None
        if not isinstance(heatmap, dict) or not isinstance(heatmap.get("source"), str) or \
                not isinstance(weights, list) or not all(
                    isinstance(head, list) and all(isinstance(row, list) and all(_number(x) for x in row)
                                                   for row in head) for head in weights):
            raise ValueError("details.heatmap must be {source: text, weights: (heads, rows, keys) of numbers}")
    for key in ("checked", "unchecked"):
        if key in details and (not isinstance(details[key], int) or isinstance(details[key], bool)):
            raise ValueError(f"details.{key} must be an integer")


def read_part(path: str, doc: Any) -> Part:
    """``doc`` (read from ``path``) as a Part; ValueError naming the file and what is wrong."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{path!r}: {what}")

    if not isinstance(doc, dict) or doc.get("tool") != "mha-verify" or not isinstance(doc.get("results"), list):
        raise bad("not an mha-verify check report")
    shard = doc.get("shard")
    if not isinstance(shard, dict):
        raise bad("not the report of a shard (no 'shard' block: it was run without --shard I/N)")
    try:
        index, count = dataclasses.astuple(_shard(shard))
        tasks, mine = shard.get("tasks"), shard.get("mine")
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise ValueError("shard.tasks must be a list of task names")
        if not isinstance(mine, list) or not all(
                isinstance(m, list) and len(m) == 2 and isinstance(m[0], str) for m in mine):
            raise ValueError("shard.mine must be a list of [task name, result count]")
        # every task gives at least one result (a crash or an n/a is one): a count of 0 or less
        # would shift the results onto the wrong tasks and drop a check from the merge
        owned = tuple((m[0], _int(m[1], f"the result count of {m[0]!r}"[:120], least=1)) for m in mine)
        results = tuple(CheckResult.from_json(r) for r in doc["results"])
        for r in results:
            check_details(r.details)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if sum(n for _, n in owned) != len(results):
        raise bad(f"its tasks account for {sum(n for _, n in owned)} results, it holds {len(results)}")
    if any(name not in tasks for name, _ in owned):
        raise bad("it ran a task its own task list does not name")
    header = {key: doc.get(key) for key in SAME}
    header["options"] = shard.get("options")  # --dtype, --max-examples: what the task list does not show
    return Part(path, index, count, tuple(tasks), owned, header, results)


def merge_checks(parts: list[Part]) -> Merged:
    """The single run's results from its ``parts`` (any order); ValueError if they are not one whole run."""
    if not parts:
        raise ValueError("no part to merge")
    first = parts[0]
    for part in parts[1:]:
        for key in (*SAME, "options"):
            if part.header[key] != first.header[key]:
                raise ValueError(f"{part.path!r} and {first.path!r} differ in {key}: "
                                 f"{part.header[key]!r} vs {first.header[key]!r}"[:400])
        if part.count != first.count:
            raise ValueError(f"{part.path!r} is a shard of {part.count}, {first.path!r} of {first.count}")
        if part.tasks != first.tasks:
            raise ValueError(f"{part.path!r} and {first.path!r} split different task lists "
                             "(another mha-verify version, --only or --no-export?)")
    seen: dict[int, str] = {}
    for part in parts:
        if part.index in seen:
            raise ValueError(f"shard {part.index}/{part.count} is given twice: {seen[part.index]!r} and {part.path!r}")
        seen[part.index] = part.path
    missing = [i for i in range(1, first.count + 1) if i not in seen]
    if missing:
        raise ValueError(f"shards {', '.join(f'{i}/{first.count}' for i in missing[:10])} are missing: "
                         "merge every part of the run")
    by_task: dict[str, list[CheckResult]] = {}
    for part in parts:
        at = 0
        for name, n in part.mine:
            if name in by_task:
                raise ValueError(f"task {name!r} was run by two shards (the second: {part.path!r})")
            by_task[name] = list(part.results[at:at + n])
            at += n
    lost = [t for t in first.tasks if t not in by_task]
    if lost:
        raise ValueError(f"no part ran the tasks {lost[:5]}: the parts are not one whole run")
    seed = first.header["seed"]
    versions = first.header["versions"]
    if not isinstance(first.header["target"], str) or not isinstance(first.header["profile"], str) \
            or not (seed is None or isinstance(seed, int)) or not isinstance(versions, dict):
        raise ValueError(f"{first.path!r}: target, profile, seed or versions has the wrong type")
    return Merged(first.header["target"], first.header["profile"], seed,
                  {str(k): str(v) for k, v in versions.items()},
                  [r for name in first.tasks for r in by_task[name]])


def merge_sweeps(docs: list[tuple[str, Any]]) -> tuple[list[Any], dict[str, str], bool]:
    """The rows (in the single sweep's order), context and whether it was a --build-only sweep,
    of a sharded sweep's parts: ``(path, sweep.json document)`` each. ValueError if they are not
    one whole sweep."""
    from mha_verify.sweep import CONTEXT_KEYS, FORMAT
    from mha_verify.sweep_rows import row_from_json

    parts = []
    for path, doc in docs:
        shard = doc.get("shard") if isinstance(doc, dict) else None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("rows"), list):
            raise ValueError(f"{path!r}: not an mha-verify sweep.json")
        if not isinstance(shard, dict) or not isinstance(shard.get("specs"), list) \
                or not all(isinstance(s, str) for s in shard["specs"]):
            raise ValueError(f"{path!r}: not the table of a shard (no 'shard' block: swept without --shard I/N)")
        try:
            index, count = dataclasses.astuple(_shard(shard))
        except ValueError as exc:
            raise ValueError(f"{path!r}: {exc}") from None
        ctx = doc.get("context")
        if not isinstance(ctx, dict) or set(ctx) != set(CONTEXT_KEYS) or \
                not all(isinstance(v, str) for v in ctx.values()) or not isinstance(doc.get("command"), str):
            raise ValueError(f"{path!r}: its context (the keys {', '.join(CONTEXT_KEYS)}) or command is missing")
        rows = [row_from_json(item, f"{path!r} row {i + 1}") for i, item in enumerate(doc["rows"])]
        for row in rows:
            if row.spec not in shard["specs"]:
                raise ValueError(f"{path!r}: row {row.spec[:80]!r} is not a class of its shard's list")
        build_only = shard.get("build_only")
        if build_only is None:  # a table from before the flag: a built row that was never checked tells
            build_only = any(row.status == "built" for row in rows)
        if not isinstance(build_only, bool):
            raise ValueError(f"{path!r}: shard.build_only must be true or false, got {build_only!r}"[:200])
        parts.append((path, index, count, tuple(shard["specs"]), doc["context"], rows, build_only))
    if not parts:
        raise ValueError("no part to merge")
    path0, _, count0, specs0, ctx0, _, build_only0 = parts[0]
    seen: dict[int, str] = {}
    by_spec: dict[str, Any] = {}
    for path, index, count, specs, ctx, rows, build_only in parts:
        if (count, specs) != (count0, specs0):
            raise ValueError(f"{path!r} and {path0!r} split different class lists or shard counts")
        if build_only != build_only0:
            raise ValueError(f"{path!r} and {path0!r}: one is a --build-only sweep and the other checked its "
                             "classes; merge the parts of one sweep")
        if ctx != ctx0:
            raise ValueError(f"{path!r} and {path0!r} differ in library, versions or profile: "
                             f"{ctx!r} vs {ctx0!r}"[:400])
        if index in seen:  # its range is Shard's to check (_shard)
            raise ValueError(f"shard {index}/{count} is given twice: {seen[index]!r} and {path!r}")
        seen[index] = path
        for row in rows:
            if row.spec in by_spec:
                raise ValueError(f"class {row.spec!r} was judged by two shards (the second: {path!r})")
            by_spec[row.spec] = row
    missing = [i for i in range(1, count0 + 1) if i not in seen]
    if missing:
        raise ValueError(f"shards {', '.join(f'{i}/{count0}' for i in missing[:10])} are missing: "
                         "merge every part of the sweep")
    lost = [s for s in specs0 if s not in by_spec]
    if lost:
        raise ValueError(f"no part judged the classes {lost[:3]}: a shard stopped early (run it again to resume)")
    return [by_spec[s] for s in specs0], {str(k): str(v) for k, v in ctx0.items()}, build_only0
