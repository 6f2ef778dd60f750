"""The ecosystem's attention layers as a user would hand them to the gate: each factory below
is the user's whole code (``--target tests/ecosystem/layers.py:NAME``); its body is the "lines
of user code" of the truth table. No hub download: every layer is built from a tiny config.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def gpt2_attention_eager(d: int, h: int) -> nn.Module:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
    return GPT2Attention(GPT2Config(n_embd=d, n_head=h, attn_implementation="eager"), layer_idx=0)


def timm_layers() -> types.ModuleType:
    """timm's ``timm.layers.attention`` module, imported without ``timm/__init__.py``.

    timm's package init imports torchvision (``timm.layers.create_norm``: FrozenBatchNorm2d),
    and no torchvision on PyPI loads with torch 2.13.0+cpu (requirements.txt says why). The
    Attention class and the modules it imports (``_fx``, ``config``, ``pos_embed_sincos``) are
    timm's own files, unchanged: the parent packages are registered as bare namespaces so
    that their ``__init__`` does not run.
    """
    if "timm.layers.attention" in sys.modules:
        return sys.modules["timm.layers.attention"]
    spec = importlib.util.find_spec("timm")
    if spec is None or spec.origin is None:
        raise ImportError("timm is not installed (tox -e ecosystem installs it with --no-deps)")
    root = Path(spec.origin).parent
    for name, path in (("timm", root), ("timm.layers", root / "layers")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
    return importlib.import_module("timm.layers.attention")


# --- the user code of each example (the truth table counts these lines) ---

def timm_attention(d: int, h: int) -> nn.Module:
    return timm_layers().Attention(d, num_heads=h, qkv_bias=True)


def timm_attention_unfused(d: int, h: int) -> nn.Module:
    m = timm_layers().Attention(d, num_heads=h, qkv_bias=True)
    m.fused_attn = False
    return m


def bert_self_attention(d: int, h: int) -> nn.Module:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertSelfAttention
    return BertSelfAttention(BertConfig(hidden_size=d, num_attention_heads=h, attn_implementation="sdpa"))


def bert_self_attention_eager(d: int, h: int) -> nn.Module:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertSelfAttention
    return BertSelfAttention(BertConfig(hidden_size=d, num_attention_heads=h, attn_implementation="eager"))


def gpt2_attention(d: int, h: int) -> nn.Module:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
    return GPT2Attention(GPT2Config(n_embd=d, n_head=h, attn_implementation="sdpa"), layer_idx=0)


def llama_gqa_attention(d: int, h: int) -> nn.Module:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention
    cfg = LlamaConfig(attn_implementation="sdpa")
    # set after validation: LlamaConfig rejects odd head_dim for RoPE, which the gate leaves out
    cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim = d, h, d // h
    cfg.num_key_value_heads = h // 2 if h % 2 == 0 else h  # grouped-query where H is even
    return LlamaAttention(cfg, layer_idx=0)


def x_transformers_attention(d: int, h: int) -> nn.Module:
    from x_transformers.x_transformers import Attention
    return Attention(dim=d, heads=h, dim_head=d // h)


def torchtune_attention(d: int, h: int) -> nn.Module:
    from torchtune.modules import MultiHeadAttention
    return MultiHeadAttention(embed_dim=d, num_heads=h, num_kv_heads=h, head_dim=d // h,
                              q_proj=nn.Linear(d, d, bias=False), k_proj=nn.Linear(d, d, bias=False),
                              v_proj=nn.Linear(d, d, bias=False), output_proj=nn.Linear(d, d, bias=False))


def torch_mha_batch_first(d: int, h: int) -> nn.Module:
    return nn.MultiheadAttention(d, h, batch_first=True)


def torch_mha_seq_first(d: int, h: int) -> nn.Module:
    return nn.MultiheadAttention(d, h)


def torch_mha_self_attention(d: int, h: int) -> nn.Module:
    m = nn.MultiheadAttention(d, h, batch_first=True)
    m.mha_verify_conventions = {"self_attention": True}  # called as m(x, x, x): its fast path's condition
    return m


def timm_attention_unfused_nan(d: int, h: int) -> nn.Module:
    m = timm_layers().Attention(d, num_heads=h, qkv_bias=True)
    m.fused_attn = False
    m.mha_verify_conventions = {"fully_masked": "nan"}  # what its explicit softmax gives, declared
    return m


USER_LINES = {  # lines of user code per example: the factory's body; 0 = the spec names the class itself
    "timm_attention": 1, "timm_attention_unfused": 3, "bert_self_attention": 3, "bert_self_attention_eager": 3,
    "gpt2_attention": 3, "gpt2_attention_eager": 3, "llama_gqa_attention": 6, "x_transformers_attention": 2,
    "torchtune_attention": 4,
    "torch_mha_batch_first": 1, "torch_mha_seq_first": 1, "torch_mha_self_attention": 3,
    "timm_attention_unfused_nan": 4,
}
