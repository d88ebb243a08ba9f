#!/usr/bin/env python3
"""Independent check of `tessera ckpt import`: the next-token loss of a Hugging Face model folder,
computed in float64 with numpy and json only, following transformers' own definitions of
GPT2LMHeadModel (Conv1D weights stored (in, out), c_attn split into q, k, v along its columns,
gelu_new) and LlamaForCausalLM / MistralForCausalLM (RMSNorm, rotate-half RoPE with rope_theta,
grouped key/value heads, SwiGLU), reading the tensors by their Hugging Face names, never through
tessera's tables. The C++ test compares it with tessera's loss of the imported checkpoint.

usage: hf_forward.py MODEL_DIR ID,ID,...   (prints the mean loss of predicting ids[1:] from ids[:-1])
"""
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = data[b:e]
        if t["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif t["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2")
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            sys.exit(f"hf_forward.py: {name} has dtype {t['dtype']}")
        out[name] = a.astype(np.float64).reshape(t["shape"])
    return out


def read_model(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(folder, "model.safetensors"))
    weights = {}
    for shard in sorted(set(json.load(open(index))["weight_map"].values())):
        weights.update(read_safetensors(os.path.join(folder, shard)))
    return weights


def softmax_causal(scores):
    T = scores.shape[-1]
    scores = scores + np.triu(np.full((T, T), -np.inf), 1)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    return p / p.sum(-1, keepdims=True)


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_logits(w, cfg, ids):
    T = len(ids)
    C, H = cfg["n_embd"], cfg["n_head"]
    D = C // H
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    p = "transformer."
    h = w[p + "wte.weight"][ids] + w[p + "wpe.weight"][:T]
    for l in range(cfg["n_layer"]):
        b = f"{p}h.{l}."
        a = layer_norm(h, w[b + "ln_1.weight"], w[b + "ln_1.bias"], eps)
        qkv = a @ w[b + "attn.c_attn.weight"] + w[b + "attn.c_attn.bias"]  # Conv1D: x W + b, W (in, out)
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, D).transpose(1, 0, 2) for i in range(3))
        y = softmax_causal(q @ k.transpose(0, 2, 1) / np.sqrt(D)) @ v
        y = y.transpose(1, 0, 2).reshape(T, C)
        h = h + y @ w[b + "attn.c_proj.weight"] + w[b + "attn.c_proj.bias"]
        m = layer_norm(h, w[b + "ln_2.weight"], w[b + "ln_2.bias"], eps)
        m = gelu_new(m @ w[b + "mlp.c_fc.weight"] + w[b + "mlp.c_fc.bias"])
        h = h + m @ w[b + "mlp.c_proj.weight"] + w[b + "mlp.c_proj.bias"]
    h = layer_norm(h, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
    head = w["lm_head.weight"] if not cfg.get("tie_word_embeddings", True) else w[p + "wte.weight"]
    return h @ head.T


def rms_norm(x, w, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def llama_logits(w, cfg, ids):
    T = len(ids)
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    D = C // H
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    inv_freq = 1.0 / theta ** (np.arange(0, D, 2) / D)
    freqs = np.outer(np.arange(T), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    h = w["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{l}."
        a = rms_norm(h, w[b + "input_layernorm.weight"], eps)
        q = (a @ w[b + "self_attn.q_proj.weight"].T).reshape(T, H, D).transpose(1, 0, 2)
        k = (a @ w[b + "self_attn.k_proj.weight"].T).reshape(T, KV, D).transpose(1, 0, 2)
        v = (a @ w[b + "self_attn.v_proj.weight"].T).reshape(T, KV, D).transpose(1, 0, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)  # head h reads kv head h // (H / KV)
        y = softmax_causal(q @ k.transpose(0, 2, 1) / np.sqrt(D)) @ v
        h = h + y.transpose(1, 0, 2).reshape(T, C) @ w[b + "self_attn.o_proj.weight"].T
        m = rms_norm(h, w[b + "post_attention_layernorm.weight"], eps)
        gate = m @ w[b + "mlp.gate_proj.weight"].T
        m = (gate / (1.0 + np.exp(-gate)) * (m @ w[b + "mlp.up_proj.weight"].T)) @ w[b + "mlp.down_proj.weight"].T
        h = h + m
    h = rms_norm(h, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return h @ head.T


def main():
    folder, ids = sys.argv[1], [int(i) for i in sys.argv[2].split(",")]
    cfg = json.load(open(os.path.join(folder, "config.json")))
    w = read_model(folder)
    arch = cfg["architectures"][0]
    if arch == "GPT2LMHeadModel":
        logits = gpt2_logits(w, cfg, ids[:-1])
    elif arch in ("LlamaForCausalLM", "MistralForCausalLM"):
        logits = llama_logits(w, cfg, ids[:-1])
    else:
        sys.exit(f"hf_forward.py: {arch} is not one this script implements")
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    targets = np.array(ids[1:])
    print(repr(float((lse - logits[np.arange(len(targets)), targets]).mean())))


if __name__ == "__main__":
    main()
