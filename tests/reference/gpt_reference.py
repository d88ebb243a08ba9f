"""tessera's GPT-2 and LLaMA models written in PyTorch: one functional definition shared by the
golden fixtures (make_golden.py, float64) and the side-by-side benchmark (scripts/bench/torch_gpt.py,
float32). Parameters live in a dict keyed by tessera's global names, Linear weights are (out, in).

A config is a dict with the keys of tessera's [model] section: preset ("gpt2" or "llama"),
vocab_size, n_layer, n_head, n_kv_head, n_embd, ffn_hidden, max_seq_len, norm_eps, rope_theta.
gpt2: LayerNorm, GELU (tanh), learned positions, biases, LM head tied to wte.
llama: RMSNorm, SwiGLU, rotary embedding (rotate-half), no biases, untied LM head, grouped-query
attention when n_kv_head < n_head. Both are pre-norm with a final norm before the head.

Vision-language models (model.kind = "vlm", model/vision.h): a config with kind "vlm" and a
"vision" dict (image_size, patch_size, channels, n_layer, n_head, n_embd, ffn_hidden,
placeholder_id). The encoder embeds flattened patches with one linear layer, adds learned positions
(vision.pos.weight), runs gpt2-style blocks with bidirectional attention and a final LayerNorm; the
projector is fc1, GELU (tanh), fc2 to the language model's width. Each image's outputs replace the
input embeddings (token and position) of its placeholder positions.
"""
import math

import torch
import torch.nn.functional as F


def llama_ffn_hidden(n_embd, multiple_of=64):
    """model/config.cpp's default SwiGLU width: 8C/3 rounded up to a multiple of 64."""
    h = (8 * n_embd) // 3
    return (h + multiple_of - 1) // multiple_of * multiple_of


def resolve(cfg):
    """Fills the defaults tessera's resolve() fills (ffn_hidden, n_kv_head), as a new dict."""
    cfg = dict(cfg)
    if not cfg.get("n_kv_head"):
        cfg["n_kv_head"] = cfg["n_head"]
    if not cfg.get("ffn_hidden"):
        cfg["ffn_hidden"] = 4 * cfg["n_embd"] if cfg["preset"] == "gpt2" else llama_ffn_hidden(cfg["n_embd"])
    cfg.setdefault("norm_eps", 1e-5)
    cfg.setdefault("rope_theta", 10000.0)
    return cfg


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
    if cfg.get("kind") == "vlm":
        shapes.update(vision_param_shapes(cfg))
    return shapes


def vision_block_config(cfg):
    """The encoder's blocks as a gpt2 config (model/config.cpp vision_block_config)."""
    v = cfg["vision"]
    return dict(preset="gpt2", vocab_size=1, n_layer=v["n_layer"], n_head=v["n_head"], n_kv_head=v["n_head"],
                n_embd=v["n_embd"], ffn_hidden=v["ffn_hidden"] or 4 * v["n_embd"],
                max_seq_len=num_patches(cfg), norm_eps=cfg["norm_eps"])


def num_patches(cfg):
    v = cfg["vision"]
    return (v["image_size"] // v["patch_size"]) ** 2


def vision_param_shapes(cfg):
    v, C = cfg["vision"], cfg["n_embd"]
    W, K, P = v["n_embd"], v["patch_size"] ** 2 * v["channels"], num_patches(cfg)
    vc = vision_block_config(cfg)
    shapes = {"vision.patch.weight": (W, K), "vision.patch.bias": (W,), "vision.pos.weight": (P, W)}
    for name, s in param_shapes(vc).items():
        if name.startswith(("blocks.", "ln_f.")):
            shapes["vision." + name] = s
    shapes.update({"projector.fc1.weight": (C, W), "projector.fc1.bias": (C,),
                   "projector.fc2.weight": (C, C), "projector.fc2.bias": (C,)})
    return shapes


def patchify(images, patch_size):
    """images (N, H, W, Ch) -> patches (N, P, p*p*Ch): patches in row-major order, each patch
    row-major over (y, x, channel) (data/image_text.h patchify), pixel values as given."""
    N, H, W_, Ch = images.shape
    p = patch_size
    x = images.reshape(N, H // p, p, W_ // p, p, Ch).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(N, (H // p) * (W_ // p), p * p * Ch)


def vision_forward(p, patches, cfg):
    """The projected patches (N, P, C) for patches (N, P, K)."""
    vc = vision_block_config(cfg)
    x = F.linear(patches, p["vision.patch.weight"], p["vision.patch.bias"]) + p["vision.pos.weight"][None]
    vp = {k[len("vision."):]: t for k, t in p.items() if k.startswith("vision.")}
    for l in range(vc["n_layer"]):
        x = block(x, vp, f"blocks.{l}", vc, causal=False)
    x = norm(x, vp, "ln_f", vc)
    h = F.gelu(linear(x, p, "projector.fc1"), approximate="tanh")
    return linear(h, p, "projector.fc2")


def tessera_init(cfg, gen, dtype=torch.float32, init_std=0.02):
    """The distributions tessera initializes from (model/gpt.cpp, model/layers.cpp): weights
    N(0, init_std), residual output projections N(0, init_std / sqrt(2 n_layer)), wpe
    N(0, init_std / 2), biases 0, norm gains 1. (tessera draws with Philox, so the values differ.)"""
    residual_std = init_std / math.sqrt(2.0 * cfg["n_layer"])
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".bias"):
            t = torch.zeros(shape, dtype=dtype)
        elif ".ln" in name or name.startswith("ln_f"):
            t = torch.ones(shape, dtype=dtype)
        else:
            if name.startswith("wpe"):
                std = init_std / 2
            elif name.endswith(("attn.proj.weight", "mlp.proj.weight", "mlp.down.weight")):
                std = residual_std
            else:
                std = init_std
            t = std * torch.randn(shape, generator=gen, dtype=dtype)
        params[name] = t.requires_grad_(True)
    return params


def rope(x, theta, pos=None):
    # x (B, T, H, D); rotate-half convention. Angles in float64, applied in x's precision.
    # pos (B, T): each token's position (packed documents restart at 0); None: 0..T-1.
    D = x.shape[-1]
    inv = theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
    if pos is None:
        pos = torch.arange(x.shape[1])[None]
    ang = pos.to(torch.float64)[..., None] * inv  # (B or 1, T, D/2)
    cos = torch.cos(ang)[:, :, None, :].to(x.dtype)
    sin = torch.sin(ang)[:, :, None, :].to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def norm(x, p, name, cfg):
    w = p[name + ".weight"]
    if cfg["preset"] == "gpt2":
        return F.layer_norm(x, (x.shape[-1],), w, p[name + ".bias"], cfg["norm_eps"])
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["norm_eps"]) * w


def linear(x, p, name):
    return F.linear(x, p[name + ".weight"], p.get(name + ".bias"))


def causal_attention(q, k, v, method, causal=True, doc_start=None):
    """q, k, v (B, H, T, D) -> (B, H, T, D). "explicit": softmax of masked scores, written out
    (the golden fixtures' oracle); "sdpa": torch's fused scaled_dot_product_attention (torch >= 2.0),
    the same function computed by PyTorch's fastest CPU path. doc_start (B, T), packed documents
    (explicit only): query i also sees no key before doc_start[b, i]."""
    if doc_start is not None:
        Tn, D = q.shape[-2], q.shape[-1]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        pos = torch.arange(Tn)
        allowed = (pos[None, :] <= pos[:, None])[None] & (pos[None, None, :] >= doc_start[:, :, None])  # (B, T, T)
        s = s.masked_fill(~allowed[:, None], float("-inf"))
        return torch.softmax(s, dim=-1) @ v
    if method == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    Tn, D = q.shape[-2], q.shape[-1]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    if causal:
        mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def block(x, p, pre, cfg, causal=True, attention="explicit", doc_start=None):
    """One pre-norm block: x + attn(norm(x)), then + mlp(norm(.))."""
    gpt2 = cfg["preset"] == "gpt2"
    Bn, Tn = x.shape[0], x.shape[1]
    H, KVH = cfg["n_head"], cfg["n_kv_head"]
    D = cfg["n_embd"] // H
    h = norm(x, p, pre + ".ln1", cfg)
    q = linear(h, p, pre + ".attn.q").view(Bn, Tn, H, D)
    k = linear(h, p, pre + ".attn.k").view(Bn, Tn, KVH, D)
    v = linear(h, p, pre + ".attn.v").view(Bn, Tn, KVH, D)
    if not gpt2:
        pos = None if doc_start is None else torch.arange(Tn)[None] - doc_start
        q, k = rope(q, cfg["rope_theta"], pos), rope(k, cfg["rope_theta"], pos)
    if KVH != H:
        k = k.repeat_interleave(H // KVH, dim=2)
        v = v.repeat_interleave(H // KVH, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
    a = causal_attention(q, k, v, attention, causal, doc_start).transpose(1, 2).reshape(Bn, Tn, H * D)
    x = x + linear(a, p, pre + ".attn.proj")
    h = norm(x, p, pre + ".ln2", cfg)
    if gpt2:
        m = linear(F.gelu(linear(h, p, pre + ".mlp.fc"), approximate="tanh"), p, pre + ".mlp.proj")
    else:
        m = linear(F.silu(linear(h, p, pre + ".mlp.gate")) * linear(h, p, pre + ".mlp.up"), p, pre + ".mlp.down")
    return x + m


def forward(p, tokens, cfg, attention="explicit", images=None, doc_start=None):
    """Logits (B*T, V) for tokens (B, T); images (kind "vlm"): (patches (N, P, K), sample, start),
    image i replacing the embeddings of sample[i]'s positions [start[i], start[i] + P); doc_start
    (B, T): packed documents, each token attending within its own (causal_attention)."""
    gpt2 = cfg["preset"] == "gpt2"
    Bn, Tn = tokens.shape
    x = p["wte.weight"][tokens]
    if gpt2:
        x = x + (p["wpe.weight"][:Tn][None] if doc_start is None else p["wpe.weight"][torch.arange(Tn)[None] - doc_start])
    if images is not None:
        patches, sample, start = images
        out = vision_forward(p, patches, cfg)
        x = x.clone()
        P = out.shape[1]
        for i, (b, t0) in enumerate(zip(sample, start)):
            x[b, t0:t0 + P] = out[i]
    for l in range(cfg["n_layer"]):
        x = block(x, p, f"blocks.{l}", cfg, attention=attention, doc_start=doc_start)
    x = norm(x, p, "ln_f", cfg)
    head = p["wte.weight"] if gpt2 else p["lm_head.weight"]
    return F.linear(x, head).view(Bn * Tn, -1)


def decays(name):
    """Default optimizer groups: weight decay on matrices only (not norms, biases, embeddings)."""
    return (name.endswith(".weight") and not name.startswith(("wte", "wpe", "ln_f", "vision.pos"))
            and ".ln" not in name)


def adamw_groups(params, weight_decay):
    """AdamW parameter groups as tessera's defaults form them (optim.decay_* = false)."""
    return [
        {"params": [t for n, t in params.items() if decays(n)], "weight_decay": weight_decay},
        {"params": [t for n, t in params.items() if not decays(n)], "weight_decay": 0.0},
    ]
