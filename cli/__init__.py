"""mha_verify: property-based verification of multi-head attention.

This package is the repository's ``cli/`` folder; its subpackages are the folders of the same
names, installed under this namespace (pyproject's package-dir) so that they never collide with a
user's own ``properties.py`` or ``export.py``:

* :mod:`mha_verify.mha`: the reference module and the pure reference formulas;
* :mod:`mha_verify.properties`: strategies, the target protocol, adapters, invariants, the runner;
* :mod:`mha_verify.export`: ONNX export;
* this package's own modules: the CLI, the gate's tasks, isolation, reports, the pytest plugin.
"""

from importlib.metadata import PackageNotFoundError, version

try:  # one source, pyproject.toml's version; a tree run without installing has none to read
    __version__ = version("mha-verify")
except PackageNotFoundError:
    __version__ = "0+unknown"

#: what a version number promises, shown by ``mha-verify --version`` (CHANGELOG.md keeps the log)
VERSION_RULE = ("while 0.y.z: a minor bump may change a verdict on the same target, a property, a tolerance "
                "rule, a flag, an exit code, a report field or a documented import path; a patch bump changes "
                "none of these. Changes are logged in CHANGELOG.md")
