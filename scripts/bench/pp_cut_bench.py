#!/usr/bin/env python3
"""The pipeline cut by measured time against the FLOPs cut (parallel.pp_cut, docs/parallel.md "Cut by
measured time"; results in docs/performance.md "Pipeline cut: measured against FLOPs"). Runs
`tessera train` on pp 2 (`--pp 4`: pp 4) under mpiexec (one OpenMP thread per rank) for each model below with
parallel.pp_cut = "flops" and "measured", alternating, `--rounds` times each; reads the last
metrics.jsonl record (the steps since the previous record: the first ones warm up) for the step's
makespan (pp_step_s), the bubble and tokens/s; prints the cuts and the header's predicted and measured
stage times, the load average (/proc/loadavg) before each run, and the medians. `--vpp 2` runs the
interleaved schedule (parallel.vpp = 2 chunks per stage) instead of 1f1b.

  cmake --build build -j2 --target tessera
  scripts/bench/pp_cut_bench.py [--rounds 3] [--steps 8] [--only head,vlm] [--pp 2] [--vpp 1] [--json out.json]
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

# name -> (config, settings, what it is)
MODELS = {
    # GPT-2 with a wide vocabulary against narrow blocks: the FLOPs formula weighs the LM head by its
    # matmul and logits; measured, the narrow blocks' small GEMMs, norms and attention run well below
    # the head's GEMM rate.
    "head": ("quickstart.toml",
             ["model.n_layer=8", "model.n_embd=64", "model.n_head=4", "model.vocab_size=2048", "train.seq_len=48",
              "train.global_batch=32", "train.micro_batch=4", "train.eval_every=0", "data.val_examples=8",
              "train.eval_batches=1", "optim.warmup_steps=2", "checkpoint.at_end=false"],
             "GPT-2, 8 blocks C=64, vocabulary 2048, T=48, micro-batch 4, 8 micro-batches per step"),
    # A vision-language model whose tower (4 blocks of width 128 over 16 patches, and its projector)
    # sits before a language model of 6 narrow blocks.
    "vlm": ("quickstart-vl.toml",
            ["model.n_layer=6", "model.n_embd=64", "model.n_head=4", "vision.n_layer=4", "vision.n_embd=128",
             "train.global_batch=32", "train.micro_batch=4", "train.eval_every=0", "data.val_examples=8",
             "train.eval_batches=1", "optim.warmup_steps=2", "checkpoint.at_end=false"],
            "VLM, tower 4 blocks C=128 (16 patches), language 6 blocks C=64, T=25, micro-batch 4, 8 per step"),
}


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def run(model, mode, steps, workdir, vpp=1, pp=2):
    config, sets, _ = MODELS[model]
    run_dir = tempfile.mkdtemp(dir=workdir)
    sets = sets + [f"parallel.pp={pp}", f'parallel.pp_cut="{mode}"', f"train.steps={steps}", f"log.every={steps // 2}"]
    if vpp > 1:
        sets += [f"parallel.vpp={vpp}", 'parallel.pp_schedule="interleaved"']
    cmd = ["mpiexec", "-n", str(pp), os.path.join(ROOT, "build", "tessera"), "train",
           os.path.join(ROOT, "configs", config), "--run-dir", run_dir]
    for s in sets:
        cmd += ["--set", s]
    before = load()
    out = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    shutil.rmtree(run_dir)
    header = "\n".join(l for l in out.stdout.splitlines() if "pipeline cut" in l or l.startswith("  parts") or
                       l.startswith("  stage times") or l.startswith("  runs") or l.startswith("  step of"))
    r = records[-1]
    return dict(model=model, mode=mode, step_s=r["pp_step_s"], bubble=r["pp_bubble_fraction"],
                tokens_per_s=r["tokens_per_s"], load=before, header=header,
                cmd=" ".join(cmd[:6] + ["<run dir>"] + cmd[7:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--pp", type=int, default=2, help="pipeline stages (ranks)")
    ap.add_argument("--vpp", type=int, default=1, help="chunks per stage (> 1: the interleaved schedule)")
    ap.add_argument("--json")
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    args = ap.parse_args()
    results = []
    for model in args.only.split(","):
        schedule = "1f1b" if args.vpp == 1 else f"interleaved, vpp {args.vpp}"
        print(f"\n## {model}: {MODELS[model][2]}, pp {args.pp} ({schedule}), {args.steps} steps, the last {args.steps // 2} measured")
        print("| cut | round | step s (pp_step_s) | bubble | tokens/s | load before |")
        print("|---|---|---|---|---|---|")
        for i in range(args.rounds):
            for mode in ("flops", "measured"):
                r = run(model, mode, args.steps, args.workdir, args.vpp, args.pp)
                results.append(r)
                print(f"| {mode} | {i + 1} | {r['step_s']:.4f} | {100 * r['bubble']:.1f}% | {r['tokens_per_s']:.0f} | "
                      f"{r['load']} |", flush=True)
        for mode in ("flops", "measured"):
            rows = [r for r in results if r["model"] == model and r["mode"] == mode]
            print(f"median {mode}: step {statistics.median(r['step_s'] for r in rows):.4f} s, bubble "
                  f"{100 * statistics.median(r['bubble'] for r in rows):.1f}%, tokens/s "
                  f"{statistics.median(r['tokens_per_s'] for r in rows):.0f}")
        for r in results:
            if r["model"] == model and r["mode"] == "measured":
                print(r["header"])
        print("command:", next(r["cmd"] for r in results if r["model"] == model and r["mode"] == "measured"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
