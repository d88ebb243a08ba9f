#!/usr/bin/env python3
"""tessera's causal attention kernel side by side with PyTorch's scaled_dot_product_attention, fp32,
in one run: build/bench/attention_bench, then torch on the same shapes, then both with the ratio
(docs/performance.md, "Attention kernel").

    /work/bench-venv/bin/python scripts/bench/attention_compare.py [--threads 2] [--reps 20]

With --rounds N the two alternate N times and each number is the best round's median (the machine
this was written on shares its host: a slow round is the neighbours, not the kernel).

torch's tensors are (B, H, T, D) views of (B, T, H, D) storage, as a transformer's projections give
them (tessera reads that layout directly). torch's backward time = median(forward + backward) -
median(forward). GFLOP/s count the visible (query, key) pairs only: T (T + 1) / 2 per head, 2
products forward, 5 backward (q k^T again, dout v^T, dS k, dS^T q, P^T dout).
"""
import argparse
import os
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F

from gemm_torch import timed

ROOT = Path(__file__).resolve().parents[2]


def run_tessera(binary, threads, warmup, reps):
    """{name: (B, T, H, KV, D, fwd ms, bwd ms)} parsed from attention_bench's table."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "--reps", str(reps), "--warmup", str(warmup)], env=env, check=True,
                         capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        if "|" not in line or line.startswith("shape"):
            continue
        left, fwd, bwd = (part.split() for part in line.split("|"))
        name = " ".join(left[:-5])
        B, T, H, KV, D = (int(x) for x in left[-5:])
        rows[name] = (B, T, H, KV, D, float(fwd[0]), float(bwd[0]))
    return rows


def run_torch(B, T, H, KV, D, warmup, reps):
    q = torch.randn(B, T, H, D).transpose(1, 2).requires_grad_()
    k = torch.randn(B, T, KV, D).transpose(1, 2).requires_grad_()
    v = torch.randn(B, T, KV, D).transpose(1, 2).requires_grad_()
    dout = torch.randn(B, H, T, D)
    gqa = {"enable_gqa": True} if KV != H else {}

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

    def forward_backward():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        out.backward(dout)
        q.grad = k.grad = v.grad = None

    fwd = timed(forward, reps, warmup) * 1e3
    return fwd, timed(forward_backward, reps, warmup) * 1e3 - fwd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default=str(ROOT / "build/bench/attention_bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    ours, theirs = {}, {}
    for _ in range(args.rounds):
        for name, row in run_tessera(args.tessera, args.threads, args.warmup, args.reps).items():
            best = ours.get(name, row)
            ours[name] = row[:5] + (min(row[5], best[5]), min(row[6], best[6]))
        for name, (B, T, H, KV, D, _, _) in ours.items():
            fwd, bwd = run_torch(B, T, H, KV, D, args.warmup, args.reps)
            best = theirs.get(name, (fwd, bwd))
            theirs[name] = (min(fwd, best[0]), min(bwd, best[1]))
    print(f"fp32 causal attention, {args.threads} threads, median of {args.reps}, best of {args.rounds} rounds; "
          f"tessera ({args.tessera}) vs torch {torch.__version__} scaled_dot_product_attention")
    print(f"{'shape':14s} {'B':>3s} {'T':>5s} {'H':>3s} {'KV':>3s} | {'fwd ms':>7s} {'torch':>7s} {'ratio':>6s} | "
          f"{'bwd ms':>7s} {'torch':>7s} {'ratio':>6s} | {'GFLOP/s fwd+bwd':>15s} {'torch':>6s}")
    for name, (B, T, H, KV, D, fwd, bwd) in ours.items():
        tfwd, tbwd = theirs[name]
        pairs = B * H * D * T * (T + 1) / 2
        flops = 2 * 7 * pairs
        print(f"{name:14s} {B:3d} {T:5d} {H:3d} {KV:3d} | {fwd:7.3f} {tfwd:7.3f} {tfwd / fwd:5.2f}x | "
              f"{bwd:7.3f} {tbwd:7.3f} {tbwd / bwd:5.2f}x | {flops / (fwd + bwd) / 1e6:15.1f} "
              f"{flops / (tfwd + tbwd) / 1e6:6.1f}")


if __name__ == "__main__":
    main()
