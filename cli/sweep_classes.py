"""Find every attention class of an installed library by reading its source, importing nothing.

A class is an attention class when its name ends in ``Attention`` (``LlamaAttention``,
``CLIPAttention``, diffusers' ``Attention``, ``T5LayerSelfAttention``): the libraries' own
naming, and the name a user reaches for. Wrappers that add a residual or a norm around the
attention (``T5LayerSelfAttention``, ``BertAttention``) are found too: whether they satisfy the
attention contract is for the gate to say, and the table says what each one is. A class named
otherwise is one when its own ``forward`` computes attention where it can be read: it calls
``scaled_dot_product_attention``, or a softmax and a product of tensors (``@``, ``matmul``,
``einsum``, ``bmm``) — MONAI's ``SABlock`` and ``CrossAttentionBlock``, named for blocks.

Reading the files with ``ast`` runs none of the library's code: the enumeration cannot hang,
crash or import what the machine lacks; the build stage meets that, one class at a time.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

#: library -> the glob of its files that hold layers, relative to the package (default: every file)
LIBRARY_FILES: dict[str, str] = {
    "transformers": "models/*/modeling_*.py",
    "diffusers": "models/**/*.py",
}
SUFFIX = "Attention"


@dataclass(frozen=True)
class Found:
    """One attention class: its spec ``package.module:Class`` and the file it is defined in."""

    spec: str
    path: str

    @property
    def name(self) -> str:
        return self.spec.rpartition(":")[2]


def package_root(library: str) -> Path:
    """The installed package's folder; ValueError naming the library when it is not installed."""
    if not all(part.isidentifier() for part in library.split(".")):
        raise ValueError(f"library {library!r} is not a package name")
    spec = importlib.util.find_spec(library)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"library {library!r} is not installed as a package here (pip install {library})")
    return Path(next(iter(spec.submodule_search_locations)))


def find_classes(library: str) -> list[Found]:
    """Every top-level class named ``*Attention`` in the library's layer files, in file order."""
    root = package_root(library)
    found: list[Found] = []
    for path in sorted(root.glob(LIBRARY_FILES.get(library, "**/*.py"))):
        if "tests" in path.relative_to(root).parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue  # a file Python could not import either: it holds no class we could build
        module = ".".join((library, *path.relative_to(root).with_suffix("").parts))
        found += [Found(f"{module}:{node.name}", str(path)) for node in tree.body
                  if isinstance(node, ast.ClassDef) and (node.name.endswith(SUFFIX) or computes_attention(node))]
    return found


#: how forwards name the query, the key and the value
_OPERANDS = (frozenset({"q", "query", "queries"}), frozenset({"k", "key", "keys"}), frozenset({"v", "value", "values"}))
#: calls that multiply tensors, by the last part of their name (``torch.einsum``, ``q.matmul``)
_PRODUCTS = frozenset({"matmul", "einsum", "bmm", "baddbmm"})


def _called(node: ast.AST) -> str:
    """The last part of a call's name: ``softmax`` for ``F.softmax(...)`` and ``x.softmax(...)``."""
    if not isinstance(node, ast.Call):
        return ""
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def computes_attention(node: ast.ClassDef) -> bool:
    """Whether the class's own ``forward`` computes attention: it calls
    ``scaled_dot_product_attention``, or calls a softmax and multiplies tensors. A block that
    hands its input to an attention child computes none in its own forward, and is not found."""
    forwards = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward"]
    if not forwards:
        return False
    nodes = list(ast.walk(forwards[0]))
    called = {_called(n) for n in nodes}
    if "scaled_dot_product_attention" in called:
        return True
    products = [n for n in nodes if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult))
                or _called(n) in _PRODUCTS]
    # a softmax-weighted product is also a router, a pooling, a CRF: attention names its operands, and
    # multiplies a query or a key (ESMFold's ``for k, v in structure.items()`` names them, multiplies neither)
    names = {n.id for n in nodes if isinstance(n, ast.Name)} | {n.arg for n in nodes if isinstance(n, ast.arg)}
    multiplied = {n.id for p in products for n in ast.walk(p) if isinstance(n, ast.Name)}
    roles = sum(bool(names & spelled) for spelled in _OPERANDS)
    return "softmax" in called and bool(multiplied & (_OPERANDS[0] | _OPERANDS[1])) and ("qkv" in names or roles >= 2)


__all__ = ["LIBRARY_FILES", "Found", "computes_attention", "find_classes", "package_root"]
