"""What a layer computes, read from a trace of one call of it: an ATen graph (``torch.export``,
non-strict, or ``make_fx`` with real tensors where export refuses), and facts as queries on its
dataflow, each with its evidence (the nodes, and the layer's source lines from their stack traces).

:mod:`.trace` makes the graph; :mod:`.facts` asks it questions: the softmax's axis and dtype, the
scale between the q·kᵀ product and the softmax (or the one SDPA is given), SDPA's causal flag.
Nothing here reads the layer's source text: a fact holds however the code is written.
"""
