#!/usr/bin/env python3
"""Tensor-parallel communication overlapped with its GEMMs (parallel.tp_overlap_chunks) measured on
CPU ranks: step time of tp2 and tp4 with sequence parallelism at k = 1 (no overlap), 2 and 4,
repeated (median of the rounds, load recorded), and the profiler's table of the last round
(communication exposed: the time ranks wait in collectives; "comm hidden": the time chunked
collectives were in flight beside GEMMs). With --async-progress the same runs again under
MPICH's progress thread (MPIR_CVAR_ASYNC_PROGRESS=1), to see which way MPI progresses here
(docs/parallel.md, "Overlapping tensor-parallel communication"; docs/performance.md).

  cmake --build build -j2 --target tessera
  scripts/bench/tp_overlap_bench.py [--rounds 3] [--tp 2,4] [--chunks 1,2,4] [--async-progress] [--json out.json]

Runs `tessera train` under mpiexec (one OpenMP thread per rank) on a 2-layer GPT (C = 256,
T = 128, batch 4) of the quickstart config, 12 steps, and reads the last metrics.jsonl record
(the 6 steps since the previous one; the first 6 warm up).
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
MODEL = ["model.n_layer=2", "model.n_embd=256", "model.n_head=4", "train.seq_len=128", "train.micro_batch=4",
         "train.global_batch=4", "train.eval_every=0", "data.val_examples=8", "train.eval_batches=1",
         "optim.warmup_steps=2", "checkpoint.at_end=false", "parallel.sequence_parallel=true", "train.profile=true"]
STEPS, EVERY = 12, 6


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def run(tp, chunks, async_progress, workdir):
    run_dir = tempfile.mkdtemp(dir=workdir)
    sets = MODEL + [f"parallel.tp={tp}", f"parallel.tp_overlap_chunks={chunks}", f"train.steps={STEPS}",
                    f"log.every={EVERY}"]
    cmd = ["mpiexec", "-n", str(tp), os.path.join(ROOT, "build", "tessera"), "train",
           os.path.join(ROOT, "configs", "quickstart.toml"), "--run-dir", run_dir]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if async_progress:
        env["MPIR_CVAR_ASYNC_PROGRESS"] = "1"
    before = load()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    shutil.rmtree(run_dir)
    text = out.stdout + out.stderr
    tables = re.findall(r"op family.*?\ntotal[^\n]*\n(?:comm hidden[^\n]*\n)?", text, re.S)
    r = records[-1]
    step_s = 4 * 128 / r["tokens_per_s"]
    return dict(tp=tp, chunks=chunks, async_progress=async_progress, step_s=step_s, loss=r["loss"],
                load_before=before, load_after=load(), table=tables[-1] if tables else "",
                cmd=("MPIR_CVAR_ASYNC_PROGRESS=1 " if async_progress else "") + " ".join(cmd[:4]) + " ... " +
                " ".join("--set " + s for s in sets[len(MODEL):]))


def row_value(table, name):
    for line in table.splitlines():
        if line.startswith(name):
            return float(line[len(name):].split()[0])
    return 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tp", default="2,4")
    p.add_argument("--chunks", default="1,2,4")
    p.add_argument("--async-progress", action="store_true", help="also run every case under MPICH's progress thread")
    p.add_argument("--json", default="")
    p.add_argument("--workdir", default=tempfile.gettempdir())
    args = p.parse_args()
    cases = [(tp, k, a) for a in ([False, True] if args.async_progress else [False])
             for tp in map(int, args.tp.split(",")) for k in map(int, args.chunks.split(","))]
    runs = {c: [] for c in cases}
    for _ in range(args.rounds):  # rounds outermost: a slow minute of the neighbours hits every case alike
        for c in cases:
            r = run(*c, args.workdir)
            runs[c].append(r)
            print(f"# tp {r['tp']} k {r['chunks']} async {int(r['async_progress'])}: {r['step_s']:.4f} s/step, load "
                  f"{r['load_before']}", file=sys.stderr, flush=True)
    print("| tp | k | async progress | step s (median) | rounds | vs k = 1 | comm exposed ms/step | comm hidden ms/step "
          "| matmul ms/step | load before runs | loss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for c in cases:
        rs = runs[c]
        med = statistics.median(r["step_s"] for r in rs)
        base = statistics.median(r["step_s"] for r in runs[(c[0], 1, c[2])]) if (c[0], 1, c[2]) in runs else med
        last = rs[-1]["table"]
        exposed, hidden, mm = row_value(last, "communication"), row_value(last, "comm hidden"), row_value(last, "matmul")
        print(f"| {c[0]} | {c[1]} | {'yes' if c[2] else 'no'} | {med:.4f} | "
              f"{', '.join('%.4f' % r['step_s'] for r in rs)} | {med / base:.3f} | {exposed:.2f} | {hidden:.2f} | "
              f"{mm:.2f} | {', '.join(r['load_before'] for r in rs)} | {rs[-1]['loss']:.6f} |", flush=True)
        results.append(dict(tp=c[0], chunks=c[1], async_progress=c[2], median_step_s=med, runs=rs))
    for c in cases:
        print(f"\n### profile (rank 0, last round): tp {c[0]}, k = {c[1]}{', async progress' if c[2] else ''}\n"
              f"`{runs[c][-1]['cmd']}`\n```\n{runs[c][-1]['table']}```")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
