"""properties: Hypothesis strategies for attention inputs and the invariants of multi-head attention."""
