#!/usr/bin/env python3
"""The planner against measured runs on this machine's ranks (docs/performance.md, "The planner
against measured runs"): calibrates the ranks (`tessera plan --calibrate`, unless --cluster names
a file), then for each layout of a small GPT-2 on the addition task runs `tessera train` under
mpiexec (one OpenMP thread per rank; --rounds times, the median kept) and `tessera plan --predict`
with the same keys, and prints predicted against measured: step time (from the last metrics record's
tokens/s), the bytes each group sent per step (the trainer's counters), the rank order (Spearman),
and where the planner's own first choice (`tessera plan --top 1`) landed among the measured.

  cmake --build build -j2 --target tessera
  scripts/bench/plan_validate.py [--ranks 2] [--rounds 3] [--cluster local.toml] [--json out.json]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESSERA = os.path.join(ROOT, "build", "tessera")
CONFIG = os.path.join(ROOT, "configs", "quickstart.toml")
# A 4-layer C=256 GPT-2 (3.2M parameters) on 2-digit addition, 32 sequences of 64 tokens a step.
MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "train.seq_len=64", "model.max_seq_len=64",
         "train.global_batch=32", "train.eval_every=0", "data.val_examples=8", "train.eval_batches=1",
         "optim.warmup_steps=2", "checkpoint.at_end=false"]

# (name, keys): every axis and option the planner chooses, on 2 ranks.
LAYOUTS_2 = [
    ("dp2", ["train.micro_batch=4"]),
    ("dp2 mb2", ["train.micro_batch=2"]),
    ("dp2 mb16", ["train.micro_batch=16"]),
    ("dp2 zero1", ["train.micro_batch=4", "parallel.zero=1"]),
    ("dp2 selective", ["train.micro_batch=4", 'model.recompute="selective"']),
    ("dp2 full", ["train.micro_batch=4", 'model.recompute="full"']),
    ("dp2 bf16", ["train.micro_batch=4", 'train.dtype="bf16"']),
    ("tp2", ["parallel.tp=2", "train.micro_batch=4"]),
    ("tp2 sp", ["parallel.tp=2", "parallel.sequence_parallel=true", "train.micro_batch=4"]),
    ("pp2 1f1b", ["parallel.pp=2", "train.micro_batch=4"]),
    ("pp2 gpipe", ["parallel.pp=2", 'parallel.pp_schedule="gpipe"', "train.micro_batch=4"]),
    ("pp2 zb-h1", ["parallel.pp=2", 'parallel.pp_schedule="zb-h1"', "train.micro_batch=4"]),
    ("pp2 interleaved", ["parallel.pp=2", 'parallel.pp_schedule="interleaved"', "parallel.vpp=2",
                         "train.micro_batch=4"]),
    ("cp2 ring", ["parallel.cp=2", "train.micro_batch=4"]),
    ("cp2 allgather", ["parallel.cp=2", 'parallel.cp_comm="allgather"', "train.micro_batch=4"]),
]


def sh(cmd, env=None):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return out.stdout


def sets(keys):
    return [a for k in MODEL + keys for a in ("--set", k)]


def measure(ranks, keys, steps, workdir):
    run_dir = tempfile.mkdtemp(dir=workdir)
    cmd = ["mpiexec", "-n", str(ranks), TESSERA, "train", CONFIG, "--run-dir", run_dir] + \
        sets(keys + [f"train.steps={steps}", "log.every=2"])
    sh(cmd, dict(os.environ, OMP_NUM_THREADS="1"))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    shutil.rmtree(run_dir)
    r = records[-1]  # the last 2 steps (the first records warm up)
    return {"step_s": 32 * 64 / r["tokens_per_s"], "tp": r.get("tp_bytes_per_step", 0),
            "cp": r.get("cp_bytes_per_step", 0), "pp": r.get("pp_bytes_per_step", 0), "dp": r.get("dp_bytes_per_step", 0)}


def predict(ranks, keys, cluster):
    out = sh([TESSERA, "plan", CONFIG, "--gpus", str(ranks), "--cluster", cluster, "--predict"] + sets(keys))
    line = [l for l in out.splitlines() if l.startswith("predicted: ")][-1]
    v = dict(kv.split("=") for kv in line[len("predicted: "):].split())
    return {"step_s": float(v["step_s"]), "tp": float(v["tp_bytes"]), "cp": float(v["cp_bytes"]),
            "pp": float(v["pp_bytes"]), "dp": float(v["dp_bytes"])}


def planner_choice(ranks, cluster):
    """The planner's first layout for the model, as --set keys."""
    out = sh([TESSERA, "plan", CONFIG, "--gpus", str(ranks), "--cluster", cluster, "--top", "1", "--dtype", "fp32",
              "--explain", "1"] + sets([]))
    m = re.search(r"layout 1: (.*)", out)
    return m.group(1).strip()


def ranks_of(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    for k, i in enumerate(order):
        r[i] = float(k)
    return r


def spearman(a, b):
    ra, rb = ranks_of(a), ranks_of(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb)


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def cpu():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--cluster", help="a calibrated cluster file (default: calibrate now)")
    p.add_argument("--only", help="comma-separated layout names")
    p.add_argument("--json")
    args = p.parse_args()
    if args.ranks != 2:
        sys.exit("the layout list is for 2 ranks")
    workdir = tempfile.mkdtemp(prefix="plan_validate_")
    cluster = args.cluster
    if not cluster:
        cluster = os.path.join(workdir, "local.toml")
        print(sh(["mpiexec", "-n", str(args.ranks), TESSERA, "plan", "--calibrate", "--out", cluster],
                 dict(os.environ, OMP_NUM_THREADS="1")))
    print(f"CPU: {cpu()}, {os.cpu_count()} cores; ranks {args.ranks}, rounds {args.rounds}; cluster {cluster}")
    layouts = [l for l in LAYOUTS_2 if not args.only or l[0] in args.only.split(",")]
    rows = []
    print("| layout | predicted step | measured step (median) | error | tp bytes pred / meas | pp bytes | cp bytes | dp bytes | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, keys in layouts:
        pred = predict(args.ranks, keys, cluster)
        runs, loads = [], []
        for _ in range(args.rounds):
            runs.append(measure(args.ranks, keys, args.steps, workdir))
            loads.append(load())
        meas = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        err = pred["step_s"] / meas["step_s"] - 1
        rows.append(dict(name=name, keys=keys, predicted=pred, measured=meas, runs=[r["step_s"] for r in runs],
                         error=err, load=loads))
        b = lambda k: f"{pred[k] / 1e6:.2f} / {meas[k] / 1e6:.2f} M"
        print(f"| {name} | {1e3 * pred['step_s']:.0f} ms | {1e3 * meas['step_s']:.0f} ms "
              f"({', '.join(f'{1e3 * r:.0f}' for r in rows[-1]['runs'])}) | {100 * err:+.0f}% | {b('tp')} | {b('pp')} | "
              f"{b('cp')} | {b('dp')} | {' '.join(loads)} |", flush=True)
    errors = [abs(r["error"]) for r in rows]
    rho = spearman([r["predicted"]["step_s"] for r in rows], [r["measured"]["step_s"] for r in rows])
    fastest = min(rows, key=lambda r: r["measured"]["step_s"])
    predicted_best = min(rows, key=lambda r: r["predicted"]["step_s"])
    choice = planner_choice(args.ranks, cluster)
    print(f"\nmedian |error| {100 * statistics.median(errors):.0f}%, largest {100 * max(errors):.0f}% "
          f"({max(rows, key=lambda r: abs(r['error']))['name']}); Spearman rank correlation {rho:.2f}")
    print(f"fastest measured: {fastest['name']} ({1e3 * fastest['measured']['step_s']:.0f} ms); predicted fastest "
          f"of these: {predicted_best['name']} (measured {1e3 * predicted_best['measured']['step_s']:.0f} ms, "
          f"{100 * (predicted_best['measured']['step_s'] / fastest['measured']['step_s'] - 1):+.0f}%)")
    print(f"the planner's first choice over every layout (fp32): {choice}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=cpu(), cluster=open(cluster).read(), rows=rows, spearman=rho, choice=choice), f, indent=1)
    shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
