#!/usr/bin/env python3
"""GPT-2 124M and 350M training speed of `tessera train` on one GPU, in bf16: the tessera side of
scripts/gpu_check.sh's GPT-2 benchmark, beside scripts/bench/gpt2_torch_cuda.py (PyTorch, same
model, same GPU, same run; docs/performance.md, "GPT-2 on one GPU").

For each (model, micro-batch B) it writes a TOML (train.device = "cuda", train.dtype = "bf16",
T = --seq, global_batch = micro_batch = B: no accumulation, constant
learning rate, no evaluation, no checkpoint, log.every = 1, log.peak_gflops = --peak-tflops) and
trains --steps steps on random token ids (an llm.c shard this script writes: no network, no
dataset needed), then reads the run's metrics.jsonl and stdout:
  RESULT tessera <model> <B> <T> <tokens/s> <MFU %> <peak GiB> <ms/step> <status>
  PROFILE tessera <model> B=<B> ... END PROFILE: the trainer's per-op-family table (train.profile),
    ms/step averaged over the measured steps, from a separate, shorter run of each model's first
    micro-batch after all timed runs (time permitting): under train.profile on a GPU every op
    family's scope synchronizes the stream (kernels/profiler.h, set_fence), so its steps are slower
    than the timed ones and only its shares are read
tokens/s and ms/step are medians over the steps after --warmup; MFU is the trainer's own (its
FLOPs count, docs/architecture.md, over log.peak_gflops); peak GiB is the trainer's allocator peak
(memory_peak_bytes: every category, on the run's device). When the first run stops before its
first step because the trainer refuses the device (today: train.device = "cuda" until its CUDA
wiring lands; or no GPU visible) it prints `NOTRUN tessera <the trainer's message>` and runs
nothing else; the exit status is 0 then. Any other failure is that row's status.
Runs in --deadline order: each model's middle micro-batch first.

    scripts/bench/gpt2_tessera_cuda.py --tessera build-gpu/app/tessera --workdir /tmp/gpt2 --deadline 120
Standard library only.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt2_bench_common import MODELS, batches_of, run_order  # noqa: E402
import train_bench as tb  # noqa: E402  (its TOML and token shard: standard library only)

# The trainer refusing the device at start (app/device.cpp, app/trainer.cpp): the whole stage is
# then "not run". Any other failure is an error row, and the other runs still go.
REFUSAL = re.compile(r"does not run on CUDA|without the CUDA backend|no CUDA device is visible|is not a device")


def write_random_shard(path, n_tokens, vocab):
    """train_bench.py's llm.c shard of random ids, written once per size (runs of several models
    share it)."""
    if not (os.path.exists(path) and os.path.getsize(path) == 1024 + 2 * n_tokens):
        tb.write_llmc_shard(path + ".tmp", n_tokens, vocab, seed=1337)
        os.replace(path + ".tmp", path)


def toml_text(name, B, args, data_path, profile=False, steps=None):
    """train_bench.py's TOML for (model, B) at T = --seq on --device in --dtype, log.peak_gflops =
    --peak-tflops (the trainer's MFU)."""
    L, H, C, V = MODELS[name]
    c = tb.BenchConfig(name, "gpt2", n_layer=L, n_head=H, n_embd=C, vocab_size=V, batch=B, seq_len=args.seq)
    return tb.tessera_toml(c, steps or args.steps, data_path, args.peak_tflops * 1000.0, args.dtype,
                           device=args.device, profile=profile)


def trainer_message(text):
    """The trainer's reason for stopping: its error line, else the last line it printed."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for l in lines:
        if re.search(r"\berror\b|refuse|not supported|does not run", l, re.IGNORECASE):
            return l
    return lines[-1] if lines else "no output"


def profile_tables(text, first_step):
    """The train.profile tables of steps >= first_step, averaged: [(family, ms/step, %, calls)]."""
    rows, n = {}, 0
    order = []
    for m in re.finditer(r"profile of steps (\d+)-(\d+)[^\n]*\n(.*?)\n\s*total[^\n]*", text, re.DOTALL):
        if int(m.group(1)) < first_step:
            continue
        n += 1
        for line in m.group(3).splitlines():
            parts = line.split()
            if len(parts) < 4 or parts[0] == "op":
                continue
            family = " ".join(parts[:-3])
            try:
                ms, calls = float(parts[-3]), float(parts[-1])
            except ValueError:
                continue
            if family not in rows:
                order.append(family)
                rows[family] = [0.0, 0.0]
            rows[family][0] += ms
            rows[family][1] += calls
    if not n:
        return []
    total = sum(v[0] for v in rows.values()) / n
    out = [(f, rows[f][0] / n, 100.0 * rows[f][0] / n / total if total else 0.0, rows[f][1] / n) for f in order]
    return sorted(out, key=lambda r: -r[1])


def run_one(name, B, args, data_path, deadline_left, profile=False):
    run_dir = os.path.join(args.workdir, f"{name}-b{B}" + ("-profile" if profile else ""))
    os.makedirs(run_dir, exist_ok=True)
    toml = os.path.join(run_dir, "bench.toml")
    with open(toml, "w") as f:
        f.write(toml_text(name, B, args, data_path, profile, args.warmup + 3 if profile else None))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    log_path = os.path.join(run_dir, "train.log")
    cmd = [args.tessera, "train", toml, "--run-dir", run_dir]
    try:
        with open(log_path, "w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=max(5, deadline_left), check=False)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    text = open(log_path, errors="replace").read()
    recs = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            recs = [json.loads(l) for l in f if l.strip()]
    steps = [r for r in recs if "tokens_per_s" in r]
    return rc, text, steps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tessera", required=True, help="the tessera binary")
    p.add_argument("--workdir", required=True, help="TOMLs, the token shard and the runs go here")
    p.add_argument("--device", default="cuda", help="train.device (default: %(default)s; cpu checks this script)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model, vocab 512, T 64, B 2 and 4: checks the logic")
    p.add_argument("--batches-124m", default="8 16 32")
    p.add_argument("--batches-350m", default="4 8 16")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--deadline", type=float, default=0, help="seconds: start no run after this (0 = none)")
    args = p.parse_args()
    end = time.monotonic() + args.deadline if args.deadline > 0 else float("inf")
    os.makedirs(args.workdir, exist_ok=True)
    batches = batches_of(args)
    order = run_order(batches)
    vocab = max(MODELS[n][3] for n, _ in batches)
    max_b = max(b for _, bs in batches for b in bs)
    data_path = os.path.join(args.workdir, f"random-v{vocab}.bin")
    write_random_shard(data_path, max(4 * max_b * (args.seq + 1), 1 << 20), vocab)
    for i, (name, B) in enumerate(order):
        left = end - time.monotonic()
        if left <= 5:
            print(f"RESULT tessera {name} {B} {args.seq} - - - - skipped:time", flush=True)
            continue
        t0 = time.monotonic()
        rc, text, steps = run_one(name, B, args, data_path, left)
        if i == 0 and not steps and rc not in (0, "timeout") and REFUSAL.search(text):
            print(f"NOTRUN tessera {trainer_message(text)}", flush=True)
            for n2, b2 in order:
                print(f"RESULT tessera {n2} {b2} {args.seq} - - - - not-run", flush=True)
            return 0
        measured = [r for r in steps if r["step"] > args.warmup]
        if len(measured) >= 2:
            step_s = statistics.median(B * args.seq / r["tokens_per_s"] for r in measured)
            tps = B * args.seq / step_s
            mfu = statistics.median(100.0 * r.get("mfu", 0.0) for r in measured)
            peak = max(r.get("memory_peak_bytes", 0) for r in steps) / 2**30
            status = "ok" if rc == 0 else ("timeout" if rc == "timeout" else f"rc={rc}")
            print(f"RESULT tessera {name} {B} {args.seq} {tps:.0f} {mfu:.1f} {peak:.2f} {1e3 * step_s:.1f} {status}",
                  flush=True)
        else:
            why = "timeout" if rc == "timeout" else ("oom" if "out of memory" in text.lower() else f"error:rc={rc}")
            print(f"RESULT tessera {name} {B} {args.seq} - - - - {why}", flush=True)
            print(f"tessera {name} B={B}: {trainer_message(text)}", file=sys.stderr, flush=True)
        print(f"tessera {name} B={B}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    # The profiles: each model's first micro-batch once more, a few steps, with train.profile.
    profiled = set()
    for name, B in order:
        if name in profiled:
            continue
        profiled.add(name)
        left = end - time.monotonic()
        if left <= 5:
            print(f"tessera {name} B={B}: no time left for the profile run", file=sys.stderr, flush=True)
            continue
        rc, text, _ = run_one(name, B, args, data_path, left, profile=True)
        table = profile_tables(text, args.warmup + 1)
        if table:
            print(f"PROFILE tessera {name} B={B} T={args.seq}: op family, ms/step, %, calls/step")
            for fam, ms, pct, calls in table:
                print(f"  {fam:<14} {ms:10.2f} {pct:6.1f}% {calls:10.1f}")
            print("END PROFILE", flush=True)
        else:
            print(f"tessera {name} B={B} profile run: {trainer_message(text)} (rc {rc})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
