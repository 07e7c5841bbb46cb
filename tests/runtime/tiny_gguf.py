"""A tiny Llama GGUF as llama.cpp's ``convert_hf_to_gguf.py`` writes one, for test_gguf.py.

Its ``llama.*`` and ``tokenizer.ggml.*`` keys, a byte-level BPE vocabulary of 284 tokens with
ChatML's control tokens, and the query and key weights in llama.cpp's rotary layout
(:func:`llama_cpp_permute`), written with the ``gguf`` package's own writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Each merge joins two tokens the vocabulary already has into the next token.
MERGES = [
    "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a n", "Ġ w", "o u",
    "a t", "Ġ c", "e n", "i s", "Ġ is", "Ġ o", "Ġ h", "in g", "Ġc at", "Ġs at", "Ġ on", "Ġ m",
    "Ġm at",
]  # fmt: skip
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Tiny:
    """The tiny Llama's shape: 2 layers, hidden 64, 4 heads of 16 over 2 KV heads."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    context: int = 128

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def vocabulary() -> list[str]:
    """ChatML's control tokens, the 256 bytes in GPT-2's byte alphabet, then one per merge."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = SPECIALS + list(bytes_to_unicode().values())
    for merge in MERGES:
        left, right = merge.split(" ")
        assert {left, right} <= set(tokens), merge
        tokens.append(left + right)
    return tokens


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: HF's rotary halves interleaved per head, as a GGUF
    stores q and k (transformers undoes it on load)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def hf_weights(shape: Tiny, vocab: int, *, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under transformers' Llama names, float32."""
    rng = np.random.default_rng(seed)

    def normal(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) * 0.1).astype(np.float32)

    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    w = {"model.embed_tokens.weight": normal(vocab, h), "model.norm.weight": 1 + normal(h)}
    if not tied:
        w["lm_head.weight"] = normal(vocab, h)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": 1 + normal(h),
            p + "post_attention_layernorm.weight": 1 + normal(h),
            p + "self_attn.q_proj.weight": normal(h, h),
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h),
            p + "self_attn.o_proj.weight": normal(h, h),
            p + "mlp.gate_proj.weight": normal(shape.ffn, h),
            p + "mlp.up_proj.weight": normal(shape.ffn, h),
            p + "mlp.down_proj.weight": normal(h, shape.ffn),
        }
    return w


GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}  # fmt: skip


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def write_gguf(
    path: Path,
    *,
    quant: str | None = None,
    tied: bool = True,
    arch: str = "llama",
    tensor_type: str | None = None,
    tokenizer: bool = True,
) -> dict[str, np.ndarray]:
    """The tiny Llama as llama.cpp writes it: F32 weights, or the matrices in ``quant``
    (Q4_1; the embedding in Q8_0, as llama.cpp's Q4_1 files keep it); ``tensor_type`` stores
    one matrix's raw bytes under another type; ``tokenizer=False`` leaves the tokenizer's keys
    out. Returns the HF-layout weights it wrote."""
    shape, tokens = Tiny(), vocabulary()
    weights = hf_weights(shape, len(tokens), tied=tied)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1 if quant else gguf.LlamaFileType.ALL_F32)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_types(
            [gguf.TokenType.CONTROL] * len(SPECIALS)
            + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
        )
        w.add_token_merges(MERGES)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_pad_token_id(2)
        w.add_add_bos_token(False)
        w.add_chat_template(CHAT_TEMPLATE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, value in weights.items():
        data = value
        if ".q_proj." in name:
            data = llama_cpp_permute(value, shape.heads)
        elif ".k_proj." in name:
            data = llama_cpp_permute(value, shape.kv_heads)
        kind = None
        if quant and data.ndim == 2:
            kind = (
                gguf.GGMLQuantizationType.Q8_0
                if "embed" in name
                else gguf.GGMLQuantizationType[quant]
            )
            data = gguf.quants.quantize(data, kind)
        if tensor_type and name.endswith("layers.0.mlp.up_proj.weight"):
            kind = gguf.GGMLQuantizationType[tensor_type]
            block, nbytes = gguf.GGML_QUANT_SIZES[kind]
            data = np.zeros((value.shape[0], value.shape[1] // block * nbytes), dtype=np.uint8)
        w.add_tensor(gguf_name(name), data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights
