#!/usr/bin/env python3
"""The pipeline measured on CPU ranks: the bubble against (p-1)/(m+p-1), pp2 against dp2 in
tokens/s, and each rank's memory by category for pp = 1, 2, 4 (docs/performance.md, "Pipeline
parallelism on CPU ranks"). Runs `tessera train` under mpiexec (one OpenMP thread per rank) on a
4-layer C=256 GPT-2 on the addition task and reads the last metrics.jsonl record of each run (the
steps since the previous record: the first records warm up).

  cmake --build build -j2 --target tessera
  scripts/bench/pipeline_bench.py [--rounds 2] [--only bubble,throughput,memory] [--schedules 1f1b:8,zb-h1:8] [--json out.json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "train.seq_len=48", "train.micro_batch=4",
         "train.eval_every=0", "data.val_examples=8", "train.eval_batches=1", "optim.warmup_steps=2", "checkpoint.at_end=false"]


def run(ranks, sets, steps, every, workdir):
    run_dir = tempfile.mkdtemp(dir=workdir)
    cmd = ["mpiexec", "-n", str(ranks), os.path.join(ROOT, "build", "tessera"), "train",
           os.path.join(ROOT, "configs", "quickstart.toml"), "--run-dir", run_dir]
    for s in MODEL + [f"train.steps={steps}", f"log.every={every}"] + sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    shutil.rmtree(run_dir)
    return " ".join("--set " + s for s in sets), records[-1]


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def formula(schedule, m, p=2, v=2):
    """The schedule's bubble at equal forward, B and W costs (docs/parallel.md)."""
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if schedule == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (m + p - 1)


def bubble(args, results):
    print("\n## bubble, pp 2, 4 steps, the last 2 measured (interleaved: parallel.vpp=2)")
    print("| schedule | m | measured bubble | formula | step s | busy s rank 0, 1 | idle s rank 0, 1 | wait s rank 0, 1 | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for item in args.schedules.split(","):
        schedule, m = item.split(":")
        m = int(m)
        for _ in range(args.rounds):
            sets = ["parallel.pp=2", f'parallel.pp_schedule="{schedule}"', f"train.global_batch={4 * m}"]
            if schedule == "interleaved":
                sets.append("parallel.vpp=2")
            cmd, r = run(2, sets, 4, 2, args.workdir)
            f = formula(schedule, m)
            row = dict(schedule=schedule, m=m, bubble=r["pp_bubble_fraction"], formula=f, step_s=r["pp_step_s"],
                       busy=r["pp_busy_s"], idle=r["pp_idle_s"], wait=r["pp_wait_s"], load=load(), cmd=cmd)
            results.setdefault("bubble", []).append(row)
            fmt = lambda v: ", ".join(f"{x:.3f}" for x in v)
            print(f"| {schedule} | {m} | {100 * row['bubble']:.1f}% | {100 * f:.1f}% | {row['step_s']:.3f} | "
                  f"{fmt(row['busy'])} | {fmt(row['idle'])} | {fmt(row['wait'])} | {row['load']} |", flush=True)


def throughput(args, results):
    print("\n## tokens/s, global batch 32 (8 micro-batches of 4), 6 steps, the last 3 measured")
    print("| layout | tokens/s | step s | load |")
    print("|---|---|---|---|")
    for name, ranks, sets in [("1 rank", 1, []), ("dp 2", 2, []), ("pp 2 (1f1b)", 2, ["parallel.pp=2"])]:
        for _ in range(args.rounds):
            cmd, r = run(ranks, sets + ["train.global_batch=32"], 6, 3, args.workdir)
            row = dict(layout=name, tokens_per_s=r["tokens_per_s"], step_s=32 * 48 / r["tokens_per_s"], load=load(),
                       cmd=cmd)
            results.setdefault("throughput", []).append(row)
            print(f"| {name} | {row['tokens_per_s'] / 1000:.2f}k | {row['step_s']:.3f} | {row['load']} |", flush=True)


def memory(args, results):
    print("\n## peak bytes per rank by category (MiB), global batch 32, 1f1b, 2 steps")
    cats = ["params", "grads", "optim", "acts", "workspace", "comm"]
    print("| pp | rank | " + " | ".join(cats) + " | total peak of rank 0 |")
    print("|---|---|" + "---|" * len(cats) + "---|")
    for pp in [1, 2, 4]:
        sets = [f"parallel.pp={pp}"] if pp > 1 else []
        cmd, r = run(pp, sets + ["train.global_batch=32"], 2, 2, args.workdir)
        results.setdefault("memory", []).append(dict(pp=pp, record=r, cmd=cmd))
        for rank in range(pp):
            mib = [r["peak_bytes_" + c][rank] / 2**20 for c in cats]
            total = f"{r['memory_peak_bytes'] / 2**20:.2f}" if rank == 0 else ""
            print(f"| {pp} | {rank} | " + " | ".join(f"{v:.2f}" for v in mib) + f" | {total} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="bubble,throughput,memory")
    p.add_argument("--schedules", default="1f1b:2,1f1b:4,1f1b:8,1f1b:16,gpipe:8,interleaved:8,zb-h1:8",
                   help="schedule:micro-batches pairs for the bubble table")
    p.add_argument("--json", default="")
    p.add_argument("--workdir", default=tempfile.gettempdir())
    args = p.parse_args()
    results = {}
    for part in args.only.split(","):
        {"bubble": bubble, "throughput": throughput, "memory": memory}[part](args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
