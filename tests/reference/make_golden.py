#!/usr/bin/python3
"""Golden fixtures for tessera's model tests, computed by PyTorch (an independent implementation).

Builds tiny GPT-2 and LLaMA models with tessera's parameter names, draws their weights (rounded to
float32 so both precisions start equal), and stores in tests/reference/golden.h5, per preset:
  attrs      the model config and AdamW settings
  tokens, targets      (B, T) int32; some targets are -1 (ignored)
  params/<name>        weights (float64 values of float32 numbers)
  logits (B*T, V), loss, grads/<name>       computed in float64
  adamw_losses (10)    loss before each of 10 AdamW steps on the same batch (float64)

Run with Debian's interpreter (python3-torch): /usr/bin/python3 tests/reference/make_golden.py
The C++ test suite only reads the HDF5 file; it never needs PyTorch.
"""
import math
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

B, T, STEPS = 2, 16, 10
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)

CONFIGS = {
    "gpt2": dict(preset="gpt2", vocab_size=97, n_layer=2, n_head=4, n_kv_head=4, n_embd=32, ffn_hidden=128,
                 max_seq_len=32, norm_eps=1e-5, rope_theta=10000.0),
    "llama": dict(preset="llama", vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48,
                  max_seq_len=32, norm_eps=1e-5, rope_theta=10000.0),
}


def param_shapes(cfg):
    """Tessera's parameter names and shapes for a config (Linear weights are (out, in))."""
    C, V, F_ = cfg["n_embd"], cfg["vocab_size"], cfg["ffn_hidden"]
    D = C // cfg["n_head"]
    KV = cfg["n_kv_head"] * D
    gpt2 = cfg["preset"] == "gpt2"
    shapes = {"wte.weight": (V, C)}
    if gpt2:
        shapes["wpe.weight"] = (cfg["max_seq_len"], C)
    for l in range(cfg["n_layer"]):
        p = f"blocks.{l}"
        norms = ["ln1", "ln2"]
        for n in norms:
            shapes[f"{p}.{n}.weight"] = (C,)
            if gpt2:
                shapes[f"{p}.{n}.bias"] = (C,)
        lin = {"attn.q": (C, C), "attn.k": (KV, C), "attn.v": (KV, C), "attn.proj": (C, C)}
        if gpt2:
            lin.update({"mlp.fc": (F_, C), "mlp.proj": (C, F_)})
        else:
            lin.update({"mlp.gate": (F_, C), "mlp.up": (F_, C), "mlp.down": (C, F_)})
        for n, s in lin.items():
            shapes[f"{p}.{n}.weight"] = s
            if gpt2:
                shapes[f"{p}.{n}.bias"] = (s[0],)
    shapes["ln_f.weight"] = (C,)
    if gpt2:
        shapes["ln_f.bias"] = (C,)
    else:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def init_params(cfg, gen):
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("bias"):
            t = 0.1 * torch.randn(shape, generator=gen, dtype=torch.float32)
        elif ".ln" in name or name.startswith("ln_f"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float32)
        else:
            t = 0.2 * torch.randn(shape, generator=gen, dtype=torch.float32)
        params[name] = t.to(torch.float64).requires_grad_(True)
    return params


def rope(x, theta):
    # x (B, T, H, D); rotate-half convention.
    D = x.shape[-1]
    inv = theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
    ang = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * inv[None, :]  # (T, D/2)
    cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def norm(x, p, name, cfg):
    w = p[name + ".weight"]
    if cfg["preset"] == "gpt2":
        return F.layer_norm(x, (x.shape[-1],), w, p[name + ".bias"], cfg["norm_eps"])
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["norm_eps"]) * w


def linear(x, p, name):
    return F.linear(x, p[name + ".weight"], p.get(name + ".bias"))


def forward(p, tokens, cfg):
    gpt2 = cfg["preset"] == "gpt2"
    Bn, Tn = tokens.shape
    H, KVH = cfg["n_head"], cfg["n_kv_head"]
    D = cfg["n_embd"] // H
    x = p["wte.weight"][tokens]
    if gpt2:
        x = x + p["wpe.weight"][:Tn][None]
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    for l in range(cfg["n_layer"]):
        pre = f"blocks.{l}"
        h = norm(x, p, pre + ".ln1", cfg)
        q = linear(h, p, pre + ".attn.q").view(Bn, Tn, H, D)
        k = linear(h, p, pre + ".attn.k").view(Bn, Tn, KVH, D)
        v = linear(h, p, pre + ".attn.v").view(Bn, Tn, KVH, D)
        if not gpt2:
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        k = k.repeat_interleave(H // KVH, dim=2)
        v = v.repeat_interleave(H // KVH, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~mask, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(Bn, Tn, H * D)
        x = x + linear(a, p, pre + ".attn.proj")
        h = norm(x, p, pre + ".ln2", cfg)
        if gpt2:
            m = linear(F.gelu(linear(h, p, pre + ".mlp.fc"), approximate="tanh"), p, pre + ".mlp.proj")
        else:
            m = linear(F.silu(linear(h, p, pre + ".mlp.gate")) * linear(h, p, pre + ".mlp.up"), p, pre + ".mlp.down")
        x = x + m
    x = norm(x, p, "ln_f", cfg)
    head = p["wte.weight"] if gpt2 else p["lm_head.weight"]
    return F.linear(x, head).view(Bn * Tn, -1)


def decays(name):
    """Default optimizer groups: weight decay on matrices only (not norms, biases, embeddings)."""
    return name.endswith(".weight") and not name.startswith(("wte", "wpe", "ln_f")) and ".ln" not in name


def make(cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    params = init_params(cfg, gen)
    V = cfg["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    targets[0, :3] = -1  # ignored positions
    targets[1, -1] = -1
    out = {"tokens": tokens.to(torch.int32).numpy(), "targets": targets.to(torch.int32).numpy()}
    out["params"] = {n: t.detach().numpy().copy() for n, t in params.items()}

    logits = forward(params, tokens, cfg)
    loss = F.cross_entropy(logits, targets.view(-1), ignore_index=-1)
    loss.backward()
    out["logits"] = logits.detach().numpy()
    out["loss"] = np.array(loss.item())
    out["grads"] = {n: t.grad.numpy().copy() for n, t in params.items()}

    groups = [
        {"params": [t for n, t in params.items() if decays(n)], "weight_decay": ADAMW["weight_decay"]},
        {"params": [t for n, t in params.items() if not decays(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        l = F.cross_entropy(forward(params, tokens, cfg), targets.view(-1), ignore_index=-1)
        l.backward()
        opt.step()
        losses.append(l.item())
    out["adamw_losses"] = np.array(losses)
    return out


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.h5")
    with h5py.File(path, "w") as f:
        f.attrs["generator"] = f"tests/reference/make_golden.py, torch {torch.__version__}"
        for i, (preset, cfg) in enumerate(CONFIGS.items()):
            g = f.create_group(preset)
            for k, v in {**cfg, **ADAMW, "batch": B, "seq_len": T, "steps": STEPS}.items():
                g.attrs[k] = v
            data = make(cfg, seed=1234 + i)
            for k in ("tokens", "targets", "logits", "loss", "adamw_losses"):
                g.create_dataset(k, data=data[k])
            for k in ("params", "grads"):
                sub = g.create_group(k)
                for n, a in data[k].items():
                    sub.create_dataset(n, data=a)
            print(f"{preset}: loss {float(data['loss']):.6f}, adamw losses {data['adamw_losses'][0]:.4f} -> "
                  f"{data['adamw_losses'][-1]:.4f}")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
