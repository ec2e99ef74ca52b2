#!/usr/bin/env python3
"""Writes a random-weight Llama GGUF (F16) with the shapes of Llama-3.2-1B or -3B, for
benchmarks at a size that does not sit in a CPU's cache (SmolLM2-135M in Q4_1 does).

The tokenizer is copied from another GGUF (byte-level BPE, e.g. SmolLM2's) and padded with
reserved control tokens up to the shape's vocabulary, so both tidegate and llama.cpp read
the same file and the output projection has the real model's size. The weights are
N(0, 0.02): the text is noise, the bytes and FLOPs per token are the real model's.
Quantize the result with llama.cpp's `llama-quantize` for Q8_0 / Q4_0 / Q4_1.

Needs numpy and the `gguf` package (PyPI). Usage:
  gen-llama-gguf.py --shape 1b --tokenizer-from SmolLM2.Q4_1.gguf --out llama1b.F16.gguf
"""
import argparse
import sys

import numpy as np
import gguf

# Hugging Face config.json of meta-llama/Llama-3.2-{1B,3B}: the fields that set shapes.
SHAPES = {
    "1b": dict(hidden=2048, ffn=8192, layers=16, heads=32, kv_heads=8, vocab=128256),
    "3b": dict(hidden=3072, ffn=8192, layers=28, heads=24, kv_heads=8, vocab=128256),
}


def field_values(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF with a gpt2 tokenizer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=8192, help="context_length to declare")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    head_dim = s["hidden"] // s["heads"]

    src = gguf.GGUFReader(a.tokenizer_from)
    if field_values(src, "tokenizer.ggml.model") != "gpt2":
        sys.exit(f"{a.tokenizer_from}: not a byte-level BPE (gpt2) tokenizer")
    tokens = list(field_values(src, "tokenizer.ggml.tokens"))
    types = list(field_values(src, "tokenizer.ggml.token_type"))
    merges = list(field_values(src, "tokenizer.ggml.merges"))
    if len(tokens) > s["vocab"]:
        sys.exit(f"tokenizer has {len(tokens)} tokens, more than the shape's {s['vocab']}")
    pad = s["vocab"] - len(tokens)
    tokens += [f"<|reserved_{i}|>" for i in range(pad)]
    types += [gguf.TokenType.CONTROL] * pad

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"random Llama-3.2-{a.shape.upper()} shapes")
    w.add_context_length(a.context)
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    pre = field_values(src, "tokenizer.ggml.pre")
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in [
        ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
        ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
    ]:
        v = field_values(src, key)
        if v is not None:
            add(int(v))
    tmpl = field_values(src, "tokenizer.chat_template")
    if tmpl:
        w.add_chat_template(tmpl)

    rng = np.random.default_rng(a.seed)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm(n):
        return np.ones(n, dtype=np.float32)

    h, kv = s["hidden"], s["kv_heads"] * head_dim
    w.add_tensor("token_embd.weight", mat(s["vocab"], h))  # tied: also the output layer
    w.add_tensor("output_norm.weight", norm(h))
    for i in range(s["layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm(h))
        w.add_tensor(b + "attn_q.weight", mat(h, h))
        w.add_tensor(b + "attn_k.weight", mat(kv, h))
        w.add_tensor(b + "attn_v.weight", mat(kv, h))
        w.add_tensor(b + "attn_output.weight", mat(h, h))
        w.add_tensor(b + "ffn_norm.weight", norm(h))
        w.add_tensor(b + "ffn_gate.weight", mat(s["ffn"], h))
        w.add_tensor(b + "ffn_up.weight", mat(s["ffn"], h))
        w.add_tensor(b + "ffn_down.weight", mat(h, s["ffn"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: Llama-3.2-{a.shape.upper()} shapes, vocab {s['vocab']} ({pad} reserved)")


if __name__ == "__main__":
    main()
