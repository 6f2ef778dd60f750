"""properties: Hypothesis strategies for attention inputs and the invariants of multi-head attention.

Rooms, each a subpackage with one job (tests/test_layering.py states which may import which):

* :mod:`.protocol` — the typed target protocol every check speaks (Subject, Instance, Conventions);
* :mod:`.loading` — ``FILE.py:NAME`` and ``module:NAME`` specs, loaded without running user text;
* :mod:`.strategies` — Hypothesis strategies for sizes, masks and whole inputs;
* :mod:`.adapters` — how a foreign layer is called and where its weights are: registry,
  recognition tables, construction, structural and calling adapters, rotary and QK-norm reading;
* :mod:`.targets` — eager torch modules bound to the protocol;
* :mod:`.onnx` — an ONNX file's interface, heads and weights read, and onnxruntime sessions as targets;
* :mod:`.engine` — the runner: measurement, the one call path, results, Hypothesis databases, profiles;
* :mod:`.invariants` — the properties, one module per family, the relations and the suite.
"""
