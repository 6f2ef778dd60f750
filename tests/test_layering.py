"""The import graph of the package: no circles anywhere, and no arrow from a lower layer to a higher one.

Every import of one of our modules counts, at the top of a file or inside a function (an
import hidden in a function can hide a cycle as well as any other). Layers, lowest first:
``mha`` (formulas), ``properties`` (protocol, targets, invariants, runner), ``export`` (graphs),
then the CLI layer (``mha_verify``'s own modules). The protocol module imports nothing of the
harness: only the mask vocabulary of ``mha.masks``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mha_verify

PACKAGE = Path(mha_verify.__file__).resolve().parent
LAYERS = {"mha": 0, "properties": 1, "export": 2}
CLI = 3


def _module_files() -> dict[str, Path]:
    files = {f"mha_verify.{p.stem}": p for p in PACKAGE.glob("*.py")}
    for sub in LAYERS:
        for p in (PACKAGE / sub).rglob("*.py"):
            files["mha_verify." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)] = p
    return {name.removesuffix(".__init__"): path for name, path in files.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], CLI) if len(parts) > 1 else CLI


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that ``module`` imports anywhere in its file (``from pkg import mod`` counts mod)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name not in (module, "mha_verify"):
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    files = _module_files()
    return {m: _imports(m, p, set(files)) for m, p in files.items()}


def test_the_package_has_the_modules_we_expect() -> None:
    graph = _graph()
    assert {"mha_verify.properties.protocol", "mha_verify.properties.engine.runner", "mha_verify.export.onnx_export",
            "mha_verify.cli", "mha_verify.mha.reference"} <= set(graph)
    assert any(graph.values()), "no import found: the scan itself is broken"


def test_no_arrow_points_up_a_layer() -> None:
    upward = sorted(f"{a} -> {b}" for a, deps in _graph().items() for b in deps if _layer(b) > _layer(a))
    assert not upward, upward


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
