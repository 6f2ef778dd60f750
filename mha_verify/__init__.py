"""mha_verify: property-based verification of multi-head attention.

Subpackages (the repository's folders of the same names, installed under this namespace so
that they never collide with a user's own ``properties.py`` or ``export.py``):

* :mod:`mha_verify.mha`: the reference module and the pure reference formulas;
* :mod:`mha_verify.properties`: strategies, the target protocol, adapters, invariants, the runner;
* :mod:`mha_verify.export`: ONNX export;
* this package's own modules: the CLI, the gate's tasks, isolation, reports, the pytest plugin.
"""

__version__ = "0.1.0"
