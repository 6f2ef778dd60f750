"""The import graph of the package: no circles anywhere, and only the arrows stated here between
its rooms.

Every import of one of our modules counts, at the top of a file or inside a function (an
import hidden in a function can hide a cycle as well as any other). The modules are read from
the repository's folders by pyproject's package-dir mapping, not from an installed copy, so a
module that no package lists is seen missing (tests/test_package.py) rather than skipped.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_modules import source_modules

#: which room may import which (its own modules always). A room is a subpackage of properties/,
#: one of its root modules, a top-level folder, or "cli" (the package's own modules, cli/).
ALLOWED: dict[str, set[str]] = {
    "mha": set(),                                                       # formulas, the reference module
    "properties.protocol": {"mha"},                                     # the typed target protocol
    "properties.stand_ins": set(),                                      # torchvision/torchaudio stand-ins
    "properties.loading": {"properties.protocol", "properties.stand_ins"},  # FILE.py:NAME / module:NAME
    "properties.strategies": {"mha"},                                   # Hypothesis strategies
    "properties.graph": set(),                                          # facts read from a traced call
    "properties.adapters": {"mha", "properties.protocol", "properties.loading"},
    "properties.targets": {"mha", "properties.protocol", "properties.loading", "properties.adapters"},
    "properties.onnx": {"mha", "properties.protocol", "properties.adapters"},
    "properties.engine": {"mha", "properties.protocol", "properties.strategies"},  # sees targets by protocol only
    "properties.invariants": {"mha", "properties.protocol", "properties.strategies", "properties.engine"},
    "export": {"mha", "properties.adapters", "properties.targets"},     # ONNX graphs of eager targets
    # whole exported models against the eager model they came from
    "properties.model": {"mha", "properties.protocol", "properties.loading", "properties.onnx", "properties.engine"},
}
ROOMS = [*ALLOWED, "properties", "cli"]


def room(module: str) -> str:
    """``mha_verify.properties.onnx.reading`` -> "properties.onnx"; ``mha_verify.gate`` -> "cli"."""
    parts = module.split(".")[1:]
    if not parts or parts[0] not in ("mha", "properties", "export"):
        return "cli"
    if parts[0] != "properties" or len(parts) == 1:
        return parts[0]
    return f"properties.{parts[1]}"


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that ``module`` imports anywhere in its file (``from pkg import mod`` counts mod)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import sub`` of a submodule imports sub; pkg counts only for a name it defines
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = subs if all(s in known for s in subs) else [node.module, *subs]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name not in (module, "mha_verify"):
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    files = source_modules()
    return {m: _imports(m, p, set(files)) for m, p in files.items()}


def test_the_package_has_the_modules_we_expect() -> None:
    graph = _graph()
    assert {"mha_verify.properties.protocol", "mha_verify.properties.engine.runner", "mha_verify.export.onnx_export",
            "mha_verify.cli", "mha_verify.mha.reference", "mha_verify.properties.strategies"} <= set(graph)
    assert any(graph.values()), "no import found: the scan itself is broken"
    assert {room(m) for m in graph} == set(ROOMS), "a room without modules, or modules in no room"


def test_only_the_stated_arrows_run_between_rooms() -> None:
    """Every arrow between two rooms is in ALLOWED; the CLI layer may import every room, and no room
    imports the CLI layer (the version a model file records is read from the package's metadata)."""
    stray = _stray(_graph())
    assert not stray, stray


def _stray(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                  if room(a) != room(b) and room(a) != "cli" and room(b) not in ALLOWED.get(room(a), set()))


def test_a_stray_arrow_is_found() -> None:
    """The check has teeth: an export module importing the CLI layer, or the engine an adapter."""
    assert _stray({"mha_verify.export.x": {"mha_verify.gate"},
                   "mha_verify.properties.engine.y": {"mha_verify.properties.adapters.base"},
                   "mha_verify.gate": {"mha_verify.export.x"}}) == [
        "mha_verify.export.x -> mha_verify.gate",
        "mha_verify.properties.engine.y -> mha_verify.properties.adapters.base"]


def test_the_stated_arrows_are_all_used() -> None:
    """ALLOWED says what the code does, not more: an arrow that no import uses is struck from it."""
    used = {(room(a), room(b)) for a, deps in _graph().items() for b in deps if room(a) != room(b)}
    unused = sorted(f"{a} -> {b}" for a, bs in ALLOWED.items() for b in bs if (a, b) not in used)
    assert not unused, unused


def test_no_import_circle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_the_protocol_imports_nothing_of_the_harness() -> None:
    assert _graph()["mha_verify.properties.protocol"] <= {"mha_verify.mha.masks", "mha_verify.mha.reference",
                                                          "mha_verify.mha.rotary", "mha_verify.mha.scoring"}


def test_a_cycle_is_found_when_there_is_one(tmp_path: Path) -> None:
    """The scan has teeth: two modules importing each other (one inside a function) are a cycle."""
    (tmp_path / "a.py").write_text("from mha_verify.properties import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from mha_verify.properties import a\n")
    known = {"mha_verify.properties.a", "mha_verify.properties.b"}
    assert _imports("mha_verify.properties.a", tmp_path / "a.py", known) == {"mha_verify.properties.b"}
    assert _imports("mha_verify.properties.b", tmp_path / "b.py", known) == {"mha_verify.properties.a"}
