#!/usr/bin/env python3
"""The GEMMs of gemm_bench.cpp (GPT-2 124M's Linear layers in their three training forms) through
PyTorch's BLAS (MKL in the PyPI wheel): does another maintained library beat OpenBLAS here?

    /work/bench-venv/bin/python scripts/bench/gemm_torch.py [--threads 2] [--reps 5]

Prints GFLOP/s per GEMM (median of --reps) and, per token count, the total flops over the total
median time of all 15 GEMMs, the number gemm_bench reports as "ALL".
"""
import argparse
import statistics
import time

import torch

LAYERS = [("attn.proj", 768, 768), ("attn.qkv", 768, 2304), ("mlp.fc", 768, 3072),
          ("mlp.proj", 3072, 768), ("lm_head", 768, 50257)]


def timed(fn, reps, warmup):
    """Median seconds of reps calls of fn after warmup calls (attention_compare.py uses it too)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tokens", default="256,1024")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = torch.__config__.show()
    blas = "MKL" if "USE_MKL=ON" in cfg or torch.backends.mkl.is_available() else "other"
    print(f"torch {torch.__version__}, BLAS {blas}, threads {torch.get_num_threads()}")
    for n in [int(t) for t in args.tokens.split(",")]:
        total_flops = total_time = 0.0
        for name, k_in, k_out in LAYERS:
            x = torch.randn(n, k_in)
            w = torch.randn(k_out, k_in)
            dy = torch.randn(n, k_out)
            dw = torch.zeros(k_out, k_in)
            forms = {
                "NT fwd": lambda: torch.mm(x, w.t()),
                "NN bwd-dx": lambda: torch.mm(dy, w),
                "TN bwd-dw": lambda: dw.addmm_(dy.t(), x),
            }
            for form, fn in forms.items():
                t = timed(fn, args.reps, args.warmup)
                flops = 2.0 * n * k_in * k_out
                total_flops += flops
                total_time += t
                print(f"{name:10s} {n:6d} {form:10s} {flops / t / 1e9:10.1f}")
        print(f"{'ALL':10s} {n:6d} {'':10s} {total_flops / total_time / 1e9:10.1f}   (all 15 GEMMs: total flops / "
              "total median time)")


if __name__ == "__main__":
    main()
