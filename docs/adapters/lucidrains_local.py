"""lucidrains' LocalAttention (local-attention 1.11.2) is an attention core: no projections, q, k, v already
split into heads, attended in buckets of window_size that see their neighbours. A factory returning a core is
verified inside the harness's projections; one bucket as long as any sequence drawn (max_length), padded to it,
is softmax attention over every key, self-attention only (buckets pair queries with keys at their positions).
It is not: autopad's zero padding is attended unless a mask is passed (docs/findings.md)."""
from local_attention import LocalAttention


def local(d_model, n_head):
    core = LocalAttention(window_size=128, autopad=True)
    core.mha_verify_conventions = {"max_length": 128, "cross_attention": False}
    return core
