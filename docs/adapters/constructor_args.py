"""Factories for the classes whose constructors need an argument no size names (a window, a stride, a
chunk, a feature map, a sequence length), each built as the library's own code builds it; what the harness
then says of each is in docs/reach.md. ``load_attr`` imports a module as ``--target`` does (vit-pytorch's
package ``__init__`` imports torchvision: skipped where it fails)."""
from mha_verify.properties.loading import load_attr as cls


def crossformer(d, h): return cls("vit_pytorch.crossformer:Attention")(d, "short", window_size=2, dim_head=d // h)
def cvt(d, h): return cls("vit_pytorch.cvt:Attention")(d, proj_kernel=3, kv_proj_stride=1, heads=h, dim_head=d // h)
def jet_window(d, h): return cls("vit_pytorch.jet_vit:WindowAttention")(d, h_s=2, w_s=2, dim_head=d // h, window_size=2)
def fast_weights(d, h):
    return cls("labml_nn.transformers.fast_weights:FastWeightsAttention")(
        h, d, dropout_prob=0.0, phi=cls("labml_nn.transformers.fast_weights:DPFP")())
def retro_chunked(d, h): return cls("labml_nn.transformers.retro.model:ChunkedCrossAttention")(d, h, d // h, 4)
def cosine_sim(d, h):
    return cls("memory_efficient_attention_pytorch.memory_efficient_cosine_sim_attention:CosineSimAttention")(
        dim=d, seq_len=64, heads=h, dim_head=d // h)
def jet_linear(d, h): return cls("vit_pytorch.jet_vit:JetViTLinearAttention")(d, h_s=2, w_s=2, heads=h, dim_head=d // h)
def fast_weights_token_wise(d, h):
    return cls("labml_nn.transformers.fast_weights.token_wise:FastWeightsAttention")(
        h, d, dropout_prob=0.0, phi=cls("labml_nn.transformers.fast_weights:DPFP")())
