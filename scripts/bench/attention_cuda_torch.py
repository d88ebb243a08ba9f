"""PyTorch's scaled_dot_product_attention (causal, bf16) at attention_cuda_bench's shapes, timed the
same way (CUDA events, median of --reps after --warmup) and printed in its RESULT format, so that
scripts/gpu_check.sh puts both in one table. FLOPs as FlashAttention counts them (see
attention_cuda_bench.cpp). Which SDPA backend runs is torch's choice (flash or cuDNN on an H100/H200);
the line says which were enabled.

    python3 scripts/bench/attention_cuda_torch.py [--reps 20] [--warmup 3] [--T 4096] [--B 4]
"""
import argparse
import statistics
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--B", type=int, default=4)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("attention_cuda_torch: no CUDA device visible")
        return 3
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    B, T = a.B, a.T
    for H, D in ((16, 128), (32, 64)):
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda: (torch.rand(B, H, T, D, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
        q, k, v, dout = mk(), mk(), mk(), mk()
        q.requires_grad_(True)
        k.requires_grad_(True)
        v.requires_grad_(True)
        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), a.warmup, a.reps)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def bwd():
            q.grad = k.grad = v.grad = None
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        bwd_ms = median_ms(bwd, a.warmup, a.reps)
        ff = 4.0 * B * H * T * T * D / 2.0
        bf = 2.5 * ff
        print(f"torch-sdpa B={B} T={T} H={H} D={D} bf16 causal: fwd {fwd:.3f} ms ({ff / fwd * 1e-9:.1f} TFLOP/s), "
              f"bwd {bwd_ms:.3f} ms ({bf / bwd_ms * 1e-9:.1f} TFLOP/s), fwd+bwd {(ff + bf) / (fwd + bwd_ms) * 1e-9:.1f} TFLOP/s")
        print(f"RESULT torch-sdpa {D} {fwd:.4f} {bwd_ms:.4f} {ff / fwd * 1e-9:.1f} {bf / bwd_ms * 1e-9:.1f} "
              f"{(ff + bf) / (fwd + bwd_ms) * 1e-9:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
