#!/usr/bin/env python3
"""Independent reference for the golden-logit fixture (needs only numpy).

A Llama decoder written directly from the equations (RMSNorm, half-split RoPE with the
config's theta, grouped-query causal attention, SwiGLU, tied embeddings), in float64, reading
the Hugging Face files (config.json + model.safetensors, parsed by hand) of the random model:

    tidegate-engine gen-random-model --out MODEL_DIR --seed 42
    python3 engine/tests/reference/golden.py MODEL_DIR engine/tests/fixtures/golden_random.json

CI does not run this script; it only compares the Rust forward pass to the committed output.
Regenerate the fixture whenever the random-model generator changes.
"""
import json
import struct
import sys

import numpy as np

PROMPTS = [
    [1, 60, 300, 7, 250, 2],
    [5, 17, 400, 88, 123, 9, 310, 42, 77, 260, 3, 1],
]


def load_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info["dtype"]
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(info["shape"]).astype(np.float64)
    return out


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, theta):
    # x: [T, heads, hd]; position p rotates pair (i, i + hd/2) by p * theta^(-2i/hd).
    t, _, hd = x.shape
    half = hd // 2
    inv = theta ** (-np.arange(half) * 2.0 / hd)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def forward(w, cfg, tokens):
    h = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = h // nh
    eps = cfg["rms_norm_eps"]
    theta = cfg["rope_theta"]
    t = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]
    causal = np.triu(np.full((t, t), -np.inf), k=1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (a @ w[p + "self_attn.q_proj.weight"].T).reshape(t, nh, hd)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).reshape(t, nkv, hd)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(t, nkv, hd)
        q, k = rope(q, theta), rope(k, theta)
        out = np.zeros((t, nh, hd))
        for head in range(nh):
            kv = head // (nh // nkv)
            s = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + causal
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            out[:, head, :] = s @ v[:, kv, :]
        x = x + out.reshape(t, h) @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = m @ w[p + "mlp.gate_proj.weight"].T
        u = m @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(f"{model_dir}/config.json"))
    w = load_safetensors(f"{model_dir}/model.safetensors")
    cases = []
    for tokens in PROMPTS:
        logits = forward(w, cfg, tokens)
        cases.append({"tokens": tokens, "logits": [[round(float(v), 5) for v in row] for row in logits]})
    json.dump({"seed": 42, "vocab_size": cfg["vocab_size"], "cases": cases}, open(out, "w"), separators=(",", ":"))
    print(f"wrote {out}: {len(cases)} prompts")


if __name__ == "__main__":
    main()
