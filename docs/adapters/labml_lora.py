"""labml's LoRA GPT-2 attention needs its LoRA rank r, which no size names."""
from labml_nn.lora.gpt2 import MultiHeadAttention


def lora_attention(d_model: int, n_head: int) -> MultiHeadAttention:
    return MultiHeadAttention(d_model, n_head, r=4)
