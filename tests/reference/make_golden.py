#!/usr/bin/python3
"""Golden fixtures for tessera's model tests, computed by PyTorch (an independent implementation).

Builds tiny GPT-2 and LLaMA models (the PyTorch definition in gpt_reference.py, shared with the
benchmark) with tessera's parameter names, draws their weights (rounded to float32 so both
precisions start equal), and stores in tests/reference/golden.h5, per preset:
  attrs      the model config and AdamW settings
  tokens, targets      (B, T) int32; some targets are -1 (ignored)
  params/<name>        weights (float64 values of float32 numbers)
  logits (B*T, V), loss, grads/<name>       computed in float64
  adamw_losses (10)    loss before each of 10 AdamW steps on the same batch (float64)
Vision-language models (vlm_gpt2, vlm_llama: model.kind = "vlm", B = 3, T = 20) add
  attrs      the [vision] sizes (vision_image_size, ...)
  images (N, H, W, Ch) uint8, patches (N, P, K) = images / 255 patchified (float64)
  image_sample, image_start (N) int64: image i replaces sample image_sample[i]'s positions
             [image_start[i], image_start[i] + P), which hold the placeholder token

Run with Debian's interpreter (python3-torch): /usr/bin/python3 tests/reference/make_golden.py
The C++ test suite only reads the HDF5 file; it never needs PyTorch.
"""
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from gpt_reference import adamw_groups, forward, num_patches, param_shapes, patchify

torch.set_default_dtype(torch.float64)

B, T, STEPS = 2, 16, 10
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)

CONFIGS = {
    "gpt2": dict(preset="gpt2", vocab_size=97, n_layer=2, n_head=4, n_kv_head=4, n_embd=32, ffn_hidden=128,
                 max_seq_len=32, norm_eps=1e-5, rope_theta=10000.0),
    "llama": dict(preset="llama", vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48,
                  max_seq_len=32, norm_eps=1e-5, rope_theta=10000.0),
}
VISION = dict(image_size=8, patch_size=2, channels=3, n_layer=2, n_head=2, n_embd=16, ffn_hidden=32, placeholder_id=96)
VLM_BATCH = dict(B=3, T=20, sample=[0, 2], start=[0, 3])  # sample 1 is text only
CONFIGS["vlm_gpt2"] = dict(CONFIGS["gpt2"], kind="vlm", vision=VISION)
CONFIGS["vlm_llama"] = dict(CONFIGS["llama"], kind="vlm", vision=VISION)


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


def make(cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    params = init_params(cfg, gen)
    V = cfg["vocab_size"]
    vlm = cfg.get("kind") == "vlm"
    Bn, Tn = (VLM_BATCH["B"], VLM_BATCH["T"]) if vlm else (B, T)
    tokens = torch.randint(0, V, (Bn, Tn), generator=gen)
    targets = torch.randint(0, V, (Bn, Tn), generator=gen)
    targets[0, :3] = -1  # ignored positions
    targets[1, -1] = -1
    images = None
    out = {}
    if vlm:
        v, P = cfg["vision"], num_patches(cfg)
        tokens[tokens == v["placeholder_id"]] = 0
        for b, t0 in zip(VLM_BATCH["sample"], VLM_BATCH["start"]):
            tokens[b, t0:t0 + P] = v["placeholder_id"]
            targets[b, max(t0 - 1, 0):t0 + P - 1] = -1  # no loss on predicting placeholders
        n = len(VLM_BATCH["sample"])
        pixels = torch.randint(0, 256, (n, v["image_size"], v["image_size"], v["channels"]), generator=gen)
        patches = patchify(pixels.to(torch.float64) / 255.0, v["patch_size"])
        images = (patches, VLM_BATCH["sample"], VLM_BATCH["start"])
        out["images"] = pixels.to(torch.uint8).numpy()
        out["patches"] = patches.numpy()
        out["image_sample"] = np.array(VLM_BATCH["sample"], dtype=np.int64)
        out["image_start"] = np.array(VLM_BATCH["start"], dtype=np.int64)
    out.update({"tokens": tokens.to(torch.int32).numpy(), "targets": targets.to(torch.int32).numpy()})
    out["params"] = {n: t.detach().numpy().copy() for n, t in params.items()}

    logits = forward(params, tokens, cfg, images=images)
    loss = F.cross_entropy(logits, targets.view(-1), ignore_index=-1)
    loss.backward()
    out["logits"] = logits.detach().numpy()
    out["loss"] = np.array(loss.item())
    out["grads"] = {n: t.grad.numpy().copy() for n, t in params.items()}

    groups = adamw_groups(params, ADAMW["weight_decay"])
    opt = torch.optim.AdamW(groups, lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        l = F.cross_entropy(forward(params, tokens, cfg, images=images), targets.view(-1), ignore_index=-1)
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
            vlm = cfg.get("kind") == "vlm"
            shape = {"batch": VLM_BATCH["B"], "seq_len": VLM_BATCH["T"]} if vlm else {"batch": B, "seq_len": T}
            attrs = {k: v for k, v in cfg.items() if k != "vision"}
            attrs.update({"vision_" + k: v for k, v in cfg.get("vision", {}).items()})
            for k, v in {**attrs, **ADAMW, **shape, "steps": STEPS}.items():
                g.attrs[k] = v
            data = make(cfg, seed=1234 + i)
            for k in ("tokens", "targets", "logits", "loss", "adamw_losses", "images", "patches", "image_sample",
                      "image_start"):
                if k in data:
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
