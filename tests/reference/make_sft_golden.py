#!/usr/bin/python3
"""Golden fixture for supervised fine-tuning data (tests/app/test_prepare_sft.cpp), by PyTorch.

Independently of tessera: renders prompt/response records with the plain template and the byte
tokenizer (ids = the UTF-8 bytes, 256 = end of document), marks the responses and each record's
end-of-document id as trained, packs the records back to back into windows of T + 1 tokens with
stride T (as tessera's TokenWindowDataset does), sets the untrained targets to -100, and computes
the loss with F.cross_entropy(..., ignore_index=-100) (the mean over the trained targets of the whole
batch) and its gradients on a tiny GPT-2 and LLaMA (gpt_reference.py) whose attention stays within
each packed record (data.document_mask: doc_start, positions restarting at each record).

Writes tests/reference/sft_golden.h5:
  attrs records      the .jsonl text the test feeds to `tessera prepare --sft`
  <preset>/attrs     model config, batch, seq_len
  <preset>/tokens, targets, doc_start   (B, T) int32 (targets -100 where ignored)
  <preset>/params/<name>, grads/<name>  float64 (params are float32 numbers); loss (float64)

Run with Debian's interpreter (python3-torch 1.13): PYTHONNOUSERSITE=1 /usr/bin/python3 tests/reference/make_sft_golden.py
"""
import json
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from gpt_reference import forward, param_shapes

torch.set_default_dtype(torch.float64)

EOT = 256
B, T = 4, 16
RECORDS = [
    {"prompt": "12+7=", "response": "19"},
    {"prompt": "What is 3 times 4? ", "response": "12"},
    {"prompt": "hi", "response": "hello there"},
    {"prompt": "Translate 'chat' to English: ", "response": "cat"},
]
CONFIGS = {
    "gpt2": dict(preset="gpt2", vocab_size=257, n_layer=2, n_head=2, n_kv_head=2, n_embd=16, ffn_hidden=64,
                 max_seq_len=16, norm_eps=1e-5, rope_theta=10000.0),
    "llama": dict(preset="llama", vocab_size=257, n_layer=2, n_head=2, n_kv_head=1, n_embd=16, ffn_hidden=32,
                  max_seq_len=16, norm_eps=1e-5, rope_theta=10000.0),
}


def render(records):
    """Byte ids and loss mask of the records back to back."""
    ids, mask = [], []
    for r in records:
        p, s = list(r["prompt"].encode()), list(r["response"].encode())
        ids += p + s + [EOT]
        mask += [0] * len(p) + [1] * (len(s) + 1)
    return ids, mask


def windows(ids, mask):
    tokens, targets, starts = [], [], []
    for b in range(B):
        w, m = ids[b * T:b * T + T + 1], mask[b * T:b * T + T + 1]
        tokens.append(w[:T])
        targets.append([w[t + 1] if m[t + 1] else -100 for t in range(T)])
        s, start = [], 0
        for t in range(T):
            s.append(start)
            if w[t] == EOT:
                start = t + 1
        starts.append(s)
    return [torch.tensor(x, dtype=torch.int64) for x in (tokens, targets, starts)]


def make(cfg, seed, tokens, targets, doc_start):
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        scale, base = (0.1, 1.0) if (".ln" in name or name.startswith("ln_f")) else (0.2, 0.0)
        if name.endswith("bias"):
            scale, base = 0.1, 0.0
        t = base + scale * torch.randn(shape, generator=gen, dtype=torch.float32)
        params[name] = t.to(torch.float64).requires_grad_(True)
    logits = forward(params, tokens, cfg, doc_start=doc_start)
    loss = F.cross_entropy(logits, targets.view(-1), ignore_index=-100)
    loss.backward()
    return params, loss


def main():
    ids, mask = render(RECORDS)
    assert len(ids) >= B * T + 1, len(ids)
    tokens, targets, doc_start = windows(ids, mask)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft_golden.h5")
    with h5py.File(path, "w") as f:
        f.attrs["generator"] = f"tests/reference/make_sft_golden.py, torch {torch.__version__}"
        f.attrs["records"] = "".join(json.dumps(r) + "\n" for r in RECORDS)
        for i, (preset, cfg) in enumerate(CONFIGS.items()):
            g = f.create_group(preset)
            for k, v in {**cfg, "batch": B, "seq_len": T}.items():
                g.attrs[k] = v
            params, loss = make(cfg, 4321 + i, tokens, targets, doc_start)
            for k, a in (("tokens", tokens), ("targets", targets), ("doc_start", doc_start)):
                g.create_dataset(k, data=a.to(torch.int32).numpy())
            g.create_dataset("loss", data=np.array(loss.item()))
            for k in ("params", "grads"):
                sub = g.create_group(k)
                for n, t in params.items():
                    sub.create_dataset(n, data=(t if k == "params" else t.grad).detach().numpy())
            trained = int((targets != -100).sum())
            print(f"{preset}: loss {loss.item():.6f} over {trained} trained targets of {B * T}")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
