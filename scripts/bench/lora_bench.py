#!/usr/bin/env python3
"""LoRA against full fine-tuning, side by side on the same CPU: GPT-2 124M (configs/gpt2-124m.toml's
model) trained a few steps with every parameter trainable, then with [lora] r = 8 (alpha 16) on attn.q
and attn.v and the base frozen. Same data (random ids in an llm.c shard), batch, sequence length and
AdamW settings (scripts/bench/train_bench.py's generated TOML). Prints per run: tokens/s (median of the
steps after warm-up), trainable parameters, tessera's memory estimate and its allocator peak (the
log's `mem`), and the process's peak RSS. docs/performance.md ("LoRA against full fine-tuning") has
the numbers.

    cmake --build build -j2 --target tessera
    scripts/bench/lora_bench.py                        # 2 warm-up + 3 measured steps, B 4, T 256
    scripts/bench/lora_bench.py --batch 8 --seq-len 512 --steps 5

Standard library only (train_bench.py's helpers).
"""
import argparse
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench as tb  # noqa: E402

LORA = '\n[lora]\nrank = 8\nalpha = 16.0\ntargets = ["attn.q", "attn.v"]\n'


def run(c, args, workdir, tag, data, lora):
    steps = args.warmup + args.steps
    toml = os.path.join(workdir, f"{tag}.toml")
    with open(toml, "w") as f:
        f.write(tb.tessera_toml(c, steps, data, args.peak_gflops) + (LORA if lora else ""))
    run_dir, log = os.path.join(workdir, f"run-{tag}"), os.path.join(workdir, f"{tag}.log")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    mon = tb.run_monitored([args.tessera, "train", toml, "--run-dir", run_dir], env, log,
                           os.path.join(run_dir, "metrics.jsonl"), args.warmup, steps, args.threads)
    text = open(log).read()
    if mon["exit"] != 0:
        sys.exit(f"tessera failed (exit {mon['exit']}); its output ({log}):\n{text[-3000:]}")
    recs = tb.step_records(os.path.join(run_dir, "metrics.jsonl"))[args.warmup:]
    find = lambda pattern: (re.findall(pattern, text) or ["?"])[-1]
    return dict(tok_s=statistics.median(r["tokens_per_s"] for r in recs), loss=recs[-1].get("loss"),
                params=int(find(r": (\d+) parameters")),
                estimate=find(r"memory estimate: [\d.]+ \w+ per rank \(tensors ([\d.]+ \w+)"), alloc_peak=find(r"\| mem ([\d.]+ \w+) \|"),
                rss_mib=(mon["rss_steps_kib"] or mon["rss_max_kib"]) / 1024.0, cpu_share=mon["cpu_share"])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tessera", default=os.path.join(tb.ROOT, "build", "tessera"))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--peak-gflops", type=float, default=100.0, help="only for the MFU column of the log")
    args = p.parse_args()
    c = tb.BenchConfig("gpt2-124m", "gpt2", 12, 12, 768, 50257, args.batch, args.seq_len)
    for key, value in tb.machine_info().items():
        print(f"{key}: {value}")
    with tempfile.TemporaryDirectory(prefix="lora_bench_") as work:
        data = os.path.join(work, "train.bin")
        tb.write_llmc_shard(data, max(200_000, 2 * (args.warmup + args.steps) * args.batch * (args.seq_len + 1)),
                            c.vocab_size, 1)
        results = {tag: run(c, args, work, tag, data, tag == "lora") for tag in ("full", "lora")}
    print(f"GPT-2 124M, B {args.batch}, T {args.seq_len}, {args.threads} threads, fp32, "
          f"{args.steps} measured steps after {args.warmup}")
    print(f"{'run':6} {'tokens/s':>10} {'estimate':>12} {'alloc peak':>12} {'peak RSS':>12} {'cpu share':>9}  trainable")
    # LoRA r on q and v (C -> C each): A (r, C) and B (C, r) per layer and target.
    results["full"]["trainable"] = results["full"]["params"]
    results["lora"]["trainable"] = c.n_layer * 2 * 2 * 8 * c.n_embd
    for tag, r in results.items():
        share = f"{r['cpu_share']:.2f}" if r["cpu_share"] is not None else "?"
        print(f"{tag:6} {r['tok_s']:10.1f} {r['estimate']:>12} {r['alloc_peak']:>12} {r['rss_mib']:9.0f} MiB "
              f"{share:>9}  {r['trainable']:,} of {r['params']:,}")
    print(f"lora / full tokens/s: {results['lora']['tok_s'] / results['full']['tok_s']:.2f}")


if __name__ == "__main__":
    main()
