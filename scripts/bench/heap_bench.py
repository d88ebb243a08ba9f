#!/usr/bin/env python3
"""Two tessera binaries side by side on 2 ranks: tokens/s and minor page faults per run of dp 2, tp 2,
tp 2 + sp, cp 2 and pp 2, interleaved rounds, medians (docs/performance.md, "Sequence parallelism
and the heap"). The model is the LLaMA of scripts/bench/plan_validate.py (4 layers, C 256, seq 64,
batch 32, micro-batch 8, bf16), 24 steps; tokens/s of the last metrics record (8 steps), page faults
of the whole run (/usr/bin/time's %R: mpiexec and the ranks it reaped).

  scripts/bench/heap_bench.py --before OLD/build/tessera --after build/tessera [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "quickstart.toml")
COMMON = ['model.preset="llama"', "model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.n_kv_head=2",
          "train.seq_len=64", "model.max_seq_len=64", "train.global_batch=32", "train.eval_every=0",
          "data.val_examples=8", "train.eval_batches=1", "optim.warmup_steps=2", "checkpoint.at_end=false",
          "train.steps=24", "log.every=8", "train.micro_batch=8", 'train.dtype="bf16"']
LAYOUTS = {"dp2": [], "tp2": ["parallel.tp=2"], "tp2 sp": ["parallel.tp=2", "parallel.sequence_parallel=true"],
           "cp2": ["parallel.cp=2"], "pp2": ["parallel.pp=2", "train.micro_batch=4"]}


def run(binary, keys):
    d = tempfile.mkdtemp()
    try:
        args = [a for k in COMMON + keys for a in ("--set", k)]
        p = subprocess.run(["/usr/bin/time", "-f", "%R", "mpiexec", "-n", "2", binary, "train", CONFIG,
                            "--run-dir", d] + args, capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
        faults = int(p.stderr.strip().splitlines()[-1])
        with open(os.path.join(d, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if '"loss"' in line]
        return records[-1]["tokens_per_s"], faults
    finally:
        subprocess.run(["rm", "-rf", d])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the tessera binary to compare against")
    ap.add_argument("--after", default=os.path.join(ROOT, "build", "tessera"))
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    binaries = {"before": a.before, "after": a.after}
    res = {}
    for r in range(a.rounds):
        for name, keys in LAYOUTS.items():
            for b, path in binaries.items():
                res.setdefault((name, b), []).append(run(path, keys))
        print(f"round {r + 1} done, load {os.getloadavg()[0]:.2f}", flush=True)
    print("| layout | before, tok/s | after, tok/s | after / before | page faults, before | after | rounds (before; after) |")
    print("|---|---|---|---|---|---|---|")
    for name in LAYOUTS:
        med = {b: statistics.median(t for t, _ in res[(name, b)]) for b in binaries}
        flt = {b: statistics.median(f for _, f in res[(name, b)]) for b in binaries}
        rounds = "; ".join(", ".join(str(round(t)) for t, _ in res[(name, b)]) for b in binaries)
        print(f"| {name} | {med['before']:.0f} | {med['after']:.0f} | {med['after'] / med['before']:.2f} | "
              f"{flt['before']:.0f} | {flt['after']:.0f} | {rounds} |")


if __name__ == "__main__":
    main()
