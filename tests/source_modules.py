"""The package's modules as the repository holds them, by installed name, read from pyproject's
package-dir mapping (the one place that says which folder installs as which package).

Shapes: ``source_modules()`` -> {"mha_verify.properties.engine.runner": Path(".../properties/engine/runner.py"), ...};
a package's ``__init__.py`` is named by the package itself.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folders() -> dict[str, Path]:
    """{package: its folder}, for every package pyproject lists (a subpackage without its own mapping
    sits in its parent's folder, as setuptools reads it)."""
    setup = _setuptools()
    mapping: dict[str, str] = setup["package-dir"]
    folders: dict[str, Path] = {}
    for package in setup["packages"]:
        parts = package.split(".")
        for i in range(len(parts), 0, -1):
            base = ".".join(parts[:i])
            if base in mapping:
                folders[package] = ROOT / mapping[base] / Path(*parts[i:])
                break
        else:
            folders[package] = ROOT / Path(*parts)
    return folders


def source_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, folder in package_folders().items():
        for path in sorted(folder.glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def unlisted_packages() -> list[Path]:
    """Folders under a listed package's folder that hold Python files but are no listed package:
    setuptools would leave them out of the wheel."""
    listed = set(package_folders().values())
    return sorted(d for top in listed for d in top.rglob("*")
                  if d.is_dir() and d not in listed and "__pycache__" not in d.parts and any(d.glob("*.py")))
