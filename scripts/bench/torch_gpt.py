#!/usr/bin/env python3
"""PyTorch reference trainer for the side-by-side benchmark (train_bench.py): trains tessera's
GPT-2 or LLaMA model, defined once in tests/reference/gpt_reference.py, in float32 eager mode (or
under CPU autocast bf16 with --autocast bf16) with
the same batch, sequence length, threads, AdamW settings (betas, eps, decoupled weight decay on
matrices only, global-norm clipping) and data (an llm.c token shard) as the tessera run.

Writes one JSON line per step to --metrics: step, loss, step_s (wall seconds of the whole step:
batch, zero_grad, forward, backward, clip, AdamW), tokens_per_s. PyTorch's fastest standard CPU
paths are used: scaled_dot_product_attention for attention and the fused AdamW where this torch
has one (--attention, --adamw to choose otherwise).

    python torch_gpt.py --info                      # torch version, BLAS, threads (JSON)
    python torch_gpt.py --preset gpt2 --layers 12 --heads 12 --embd 768 --vocab 50257 \
        --batch 4 --seq 64 --steps 13 --threads 2 --data tokens.bin --metrics torch.jsonl
"""
import argparse
import json
import os
import re
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "reference"))
import gpt_reference as ref  # noqa: E402

LLMC_MAGIC, LLMC_HEADER_BYTES = 20240520, 1024


def torch_info():
    """What the benchmark reports about this PyTorch: version, BLAS, SIMD level, threads."""
    settings = dict(re.findall(r"([A-Z_]+)=([^,\s]*)", torch.__config__.show()))
    return {
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "blas": settings.get("BLAS_INFO", "?"),
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "openmp": settings.get("USE_OPENMP", "?"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?",
    }


def read_llmc_shard(path):
    """Tokens (uint16) of an llm.c GPT-2 shard: 256 int32 header (magic, version, count), then ids."""
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != LLMC_MAGIC or header[1] != 1:
        sys.exit(f"{path}: not an llm.c GPT-2 token shard (magic {header[0]}, version {header[1]})")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=LLMC_HEADER_BYTES, shape=(int(header[2]),))


def batch_at(tokens, step, B, T):
    """Inputs and targets (B, T) for a step: consecutive windows of T + 1 tokens, wrapping around."""
    span = T + 1
    starts = [((step * B + b) * span) % (len(tokens) - span) for b in range(B)]
    w = np.stack([np.asarray(tokens[s:s + span], dtype=np.int64) for s in starts])
    w = torch.from_numpy(w)
    return w[:, :-1], w[:, 1:]


def make_adamw(groups, args):
    """torch.optim.AdamW with the chosen implementation; "auto" = fused if this torch has a CPU
    fused kernel (torch >= 2.4), else the multi-tensor (foreach) one. Returns (optimizer, name)."""
    kw = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    if args.adamw in ("auto", "fused"):
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "fused"
        except (RuntimeError, TypeError, ValueError) as e:
            if args.adamw == "fused":
                sys.exit(f"fused AdamW not available in torch {torch.__version__}: {e}")
    if args.adamw in ("auto", "foreach"):
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"
    return torch.optim.AdamW(groups, foreach=False, **kw), "for-loop"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--info", action="store_true", help="print torch's version, BLAS and threads as JSON and exit")
    p.add_argument("--preset", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=0, help="0 = heads")
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--ffn", type=int, default=0, help="0 = the preset's default (as tessera)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=13)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--data", help="llm.c token shard (uint16); default: random tokens")
    p.add_argument("--metrics", help="per-step JSON lines go here (default: stdout)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="global-norm clipping; 0 = off (norm still computed)")
    p.add_argument("--adamw", choices=["auto", "fused", "foreach", "for-loop"], default="auto")
    p.add_argument("--attention", choices=["auto", "sdpa", "explicit"], default="auto",
                   help="auto = sdpa where this torch has it (>= 2.0), else explicit")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none",
                   help="bf16: forward and loss under torch.autocast('cpu', torch.bfloat16) (mixed precision; "
                        "fp32 parameters, gradients and AdamW), as tessera's train.dtype = \"bf16\"")
    p.add_argument("--profile", action="store_true",
                   help="after the timed steps, run one more under torch.profiler and print its op table to stderr")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.info:
        print(json.dumps(torch_info()))
        return
    torch.manual_seed(args.seed)
    if args.attention == "auto":
        args.attention = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "explicit"
    cfg = ref.resolve(dict(preset=args.preset, vocab_size=args.vocab, n_layer=args.layers, n_head=args.heads,
                           n_kv_head=args.kv_heads, n_embd=args.embd, ffn_hidden=args.ffn, max_seq_len=args.seq))
    params = ref.tessera_init(cfg, torch.Generator().manual_seed(args.seed))
    opt, adamw_impl = make_adamw(ref.adamw_groups(params, args.weight_decay), args)
    plist = list(params.values())
    B, T = args.batch, args.seq
    if args.data:
        tokens = read_llmc_shard(args.data)
    else:
        tokens = np.random.default_rng(args.seed).integers(0, args.vocab, size=1 << 20, dtype=np.uint16)
    if int(tokens.max()) >= args.vocab:
        sys.exit(f"token id {int(tokens.max())} >= vocab {args.vocab}")
    print(f"torch {torch.__version__}: {cfg['preset']} {sum(t.numel() for t in plist)} parameters, "
          f"B={B} T={T}, {torch.get_num_threads()} threads, AdamW {adamw_impl}, attention {args.attention}, "
          f"autocast {args.autocast}",
          file=sys.stderr, flush=True)
    out = open(args.metrics, "w") if args.metrics else sys.stdout
    max_norm = args.grad_clip if args.grad_clip > 0 else float("inf")

    def step(s):
        x, y = batch_at(tokens, s, B, T)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            logits = ref.forward(params, x, cfg, attention=args.attention)  # (B*T, V)
            loss = F.cross_entropy(logits, y.reshape(-1))  # autocast runs cross_entropy in fp32
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, max_norm)
        opt.step()
        return loss.item()

    for s in range(args.steps):
        t0 = time.perf_counter()
        loss = step(s)
        dt = time.perf_counter() - t0
        rec = {"step": s + 1, "loss": loss, "step_s": dt, "tokens_per_s": B * T / dt}
        out.write(json.dumps(rec) + "\n")
        out.flush()
    if args.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(args.steps)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)


if __name__ == "__main__":
    main()
