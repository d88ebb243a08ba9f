#!/usr/bin/env python3
"""GPT-2 training speed in PyTorch on one GPU: the PyTorch side of scripts/gpu_check.sh's GPT-2
benchmark, beside `tessera train` (scripts/bench/gpt2_tessera_cuda.py) on the same GPU in the
same run (docs/performance.md, "GPT-2 on one GPU").

The model is tessera's GPT-2 as tests/reference/gpt_reference.py writes it (separate q/k/v
Linears, tanh GELU, tied head), trained as tessera trains in bf16: fp32 parameters, gradients
and AdamW (fused where this torch has it), forward and loss under torch.autocast(bfloat16),
scaled_dot_product_attention, global-norm clipping at 1.0, constant learning rate 3e-4. Tokens
are random ids (the speed does not depend on them). --mode eager runs it as written; --mode
compile wraps forward + loss in torch.compile (backward through AOTAutograd; one compilation per
shape, so each micro-batch size pays its own). Where torch.compile is missing (torch < 2.0) or
fails, the runs are reported as not run, with the reason, and the script still exits 0.

Prints, one line each (scripts/gpu_check.sh reads them):
  INFO <torch version, device, what the mode used>
  RESULT torch-<mode> <model> <B> <T> <tokens/s> <MFU %> <peak GiB> <ms/step> <status>
tokens/s and ms/step are medians over the steps after --warmup; MFU = tokens/s x FLOPs per token
(tessera's count, scripts/bench/train_bench.py flops_per_token: 6 N plus attention, LM head
included) / --peak-tflops; peak GiB = torch.cuda.max_memory_allocated (cuda only). status: ok,
oom, error:<what>, not-run:<why>, skipped:time (--deadline reached before it started).

    python3 scripts/bench/gpt2_torch_cuda.py --device cuda --mode compile          # on the GPU
    /usr/bin/python3 scripts/bench/gpt2_torch_cuda.py --device cpu --tiny --mode eager   # rehearsal
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "reference"))
sys.path.insert(0, HERE)
import gpt_reference as ref  # noqa: E402
from train_bench import BenchConfig, flops_per_token  # noqa: E402
from gpt2_bench_common import MODELS, batches_of, run_order  # noqa: E402

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model, vocab 512, T 64, B 2 and 4: checks the logic on a CPU")
    p.add_argument("--batches-124m", default="8 16 32", help="micro-batch sizes of GPT-2 124M (default: %(default)s)")
    p.add_argument("--batches-350m", default="4 8 16", help="micro-batch sizes of GPT-2 350M (default: %(default)s)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the medians (compilation, allocator warm-up)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="MFU's denominator (default: H100/H200 SXM dense bf16)")
    p.add_argument("--deadline", type=float, default=0, help="seconds: start no run after this, stop a run's steps at it (0 = none)")
    p.add_argument("--seed", type=int, default=1337)
    return p.parse_args()


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds if seconds > 0 else math.inf

    def passed(self):
        return time.monotonic() >= self.end


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def make_adamw(params, device):
    groups = ref.adamw_groups(params, 0.1)
    kw = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    try:
        return torch.optim.AdamW(groups, fused=True, **kw), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"


def bench_one(name, B, args, deadline, state):
    """One (model, B) run; returns (status, tokens/s, mfu %, peak GiB, ms/step)."""
    L, H, C, V = MODELS[name]
    T = args.seq
    dev = args.device
    cfg = ref.resolve(dict(preset="gpt2", vocab_size=V, n_layer=L, n_head=H, n_kv_head=0, n_embd=C, ffn_hidden=0,
                           max_seq_len=T))
    gen = torch.Generator().manual_seed(args.seed)
    params = {k: t.detach().to(dev).requires_grad_(True) for k, t in ref.tessera_init(cfg, gen).items()}
    opt, state["adamw"] = make_adamw(params, dev)
    plist = list(params.values())
    attention = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "explicit"
    state["attention"] = attention

    def loss_fn(x, y):
        with torch.autocast(dev, dtype=torch.bfloat16):
            logits = ref.forward(params, x, cfg, attention=attention)  # (B*T, V)
            return F.cross_entropy(logits.float(), y.reshape(-1))

    fn = loss_fn
    if args.mode == "compile":
        fn = torch.compile(loss_fn)
    g = torch.Generator(device=dev).manual_seed(args.seed)
    pool = [torch.randint(0, V, (B, T + 1), device=dev, generator=g) for _ in range(4)]
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for s in range(args.steps):
        if deadline.passed():
            break
        w = pool[s % len(pool)]
        sync(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = fn(w[:, :-1], w[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, 1.0)
        opt.step()
        loss_value = loss.item()  # waits for the step, as tessera's loss read does
        sync(dev)
        times.append(time.perf_counter() - t0)
        if not math.isfinite(loss_value):
            return f"error:loss={loss_value}", None, None, None, None
    measured = times[args.warmup:]
    if len(measured) < 2:
        return "skipped:time", None, None, None, None
    step_s = statistics.median(measured)
    tps = B * T / step_s
    c = BenchConfig(name, "gpt2", n_layer=L, n_head=H, n_embd=C, vocab_size=V, batch=B, seq_len=T)
    mfu = 100.0 * tps * flops_per_token(c) / (args.peak_tflops * 1e12)
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None
    status = "ok" if len(measured) == args.steps - args.warmup else f"ok({len(measured)}-steps)"
    return status, tps, mfu, peak, 1e3 * step_s


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    args = parse_args()
    deadline = Deadline(args.deadline)
    batches = batches_of(args)
    order = run_order(batches)
    tag = f"torch-{args.mode}"
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"INFO torch {torch.__version__}: no CUDA device visible")
        for name, B in order:
            print(f"RESULT {tag} {name} {B} {args.seq} - - - - not-run:no-cuda-device", flush=True)
        return
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    if args.mode == "compile" and not hasattr(torch, "compile"):
        print(f"INFO torch {torch.__version__} on {where}: torch.compile not available (torch < 2.0)")
        for name, B in order:
            print(f"RESULT {tag} {name} {B} {args.seq} - - - - not-run:no-torch.compile-in-{torch.__version__}", flush=True)
        return
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # bf16 autocast covers the matmuls; fp32 stays fp32
    state = {}
    compile_broken = None
    printed_info = False
    for name, B in order:
        if deadline.passed():
            print(f"RESULT {tag} {name} {B} {args.seq} - - - - skipped:time", flush=True)
            continue
        if compile_broken:
            print(f"RESULT {tag} {name} {B} {args.seq} - - - - not-run:torch.compile-failed", flush=True)
            continue
        t0 = time.monotonic()
        try:
            status, tps, mfu, peak, ms = bench_one(name, B, args, deadline, state)
        except Exception as e:  # noqa: BLE001 -- reported per run: OOM, a compiler failure, anything
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            oom = "out of memory" in str(e).lower()
            status, tps, mfu, peak, ms = ("oom" if oom else "error:" + type(e).__name__), None, None, None, None
            print(f"{tag} {name} B={B}: {type(e).__name__}: {msg[:300]}", file=sys.stderr, flush=True)
            if args.mode == "compile" and not oom:
                compile_broken = msg
        if not printed_info and state:
            print(f"INFO torch {torch.__version__} on {where}, {args.mode}, AdamW {state.get('adamw')}, "
                  f"attention {state.get('attention')}, autocast bf16", flush=True)
            printed_info = True
        print(f"RESULT {tag} {name} {B} {args.seq} {fmt(tps, '.0f')} {fmt(mfu, '.1f')} {fmt(peak, '.2f')} "
              f"{fmt(ms, '.1f')} {status}", flush=True)
        print(f"{tag} {name} B={B}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
        if args.mode == "compile" and hasattr(torch, "_dynamo"):
            torch._dynamo.reset()  # each run compiles its own graph; nothing is kept between models
    if compile_broken:
        print(f"INFO torch.compile failed: {compile_broken[:300]}", flush=True)


if __name__ == "__main__":
    main()
