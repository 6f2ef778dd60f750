"""Whole exported models that take token ids, held against the eager model they came from: their
inputs read from the names exporters write (``inputs``), the eager model loaded (``eager``),
generated batches (``batches``), the relations checked (``checks``) and run with Hypothesis
(``runner``)."""
