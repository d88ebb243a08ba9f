#!/usr/bin/env python3
"""Variable-length batches (data.batching = "tokens", docs/data.md) against fixed windows with the
document mask (results in docs/performance.md "Variable-length batches"). Generates a corpus whose
document lengths are log-normal (bytes, clipped to [16, --max-len]), prepares it with the byte
tokenizer, and trains the same GPT-2-style model on dp 2 (mpiexec -n 2, one OpenMP thread per rank)
with the same tokens per step both ways, alternating, `--rounds` times each. Reads the last
metrics.jsonl record (the steps since the previous record: the first ones warm up): real tokens/s
(windows: every token is real, tokens_per_s; tokens: real_tokens_per_s, padding left out), the rows'
fill (real tokens / positions) and the dp token imbalance (max over ranks / mean - 1, mean and worst
over the measured steps). Prints the load average (/proc/loadavg) before each run and the medians.

  cmake --build build -j2 --target tessera
  scripts/bench/varlen_bench.py [--rounds 3] [--steps 12] [--docs 3000] [--json out.json]
"""
import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESSERA = os.path.join(ROOT, "build", "tessera")
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()

# The model and step: GPT-2 preset, 4 blocks of width 128, seq_len 256, 16 rows per step on dp 2
# (2 micro-batches of 4 rows per rank): 4096 positions per step both ways.
MODEL = ["model.preset=\"gpt2\"", "model.n_layer=4", "model.n_head=4", "model.n_embd=128", "train.seq_len=256",
         "model.max_seq_len=1024", "train.global_batch=16", "train.eval_every=0", "optim.warmup_steps=2",
         "checkpoint.at_end=false", "data.task=\"tokens\"", "data.tokenizer=\"byte\"", "parallel.dp=2"]
MODES = {
    "windows": ["data.batching=\"windows\"", "data.document_mask=true", "train.micro_batch=4"],
    "tokens": ["data.batching=\"tokens\"", "train.tokens_per_micro_batch=1024"],
}


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def make_corpus(workdir, docs, median, sigma, max_len, seed, min_len=16):
    rng = random.Random(seed)
    path = os.path.join(workdir, "corpus.jsonl")
    lengths = []
    with open(path, "w") as f:
        for _ in range(docs):
            n = int(min(max_len, max(min_len, rng.lognormvariate(math.log(median), sigma))))
            text = ""
            while len(text) < n:
                text += rng.choice(WORDS) + " "
            lengths.append(n)
            f.write(json.dumps({"text": text[:n]}) + "\n")
    prefix = os.path.join(workdir, "corpus")
    out = subprocess.run([TESSERA, "prepare", "--input", path, "--tokenizer", "byte", "--out", prefix],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"prepare failed:\n{out.stdout}\n{out.stderr}")
    lengths.sort()
    return prefix, lengths


def train(ranks, sets, workdir, keep=()):
    """`tessera train configs/quickstart.toml` on `ranks` ranks with `sets` in a fresh run directory
    (removed after): its training records (metrics.jsonl lines with a loss), the load average before
    it, the command, and the text of each file named in `keep` ("" when the run wrote none)."""
    run_dir = tempfile.mkdtemp(dir=workdir)
    cmd = ["mpiexec", "-n", str(ranks), TESSERA, "train", os.path.join(ROOT, "configs", "quickstart.toml"),
           "--run-dir", run_dir]
    for s in sets:
        cmd += ["--set", s]
    before = load()
    out = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    kept = {}
    for name in keep:
        path = os.path.join(run_dir, name)
        kept[name] = open(path).read() if os.path.exists(path) else ""
    shutil.rmtree(run_dir)
    return records, before, cmd, kept


def run(mode, prefix, steps, workdir):
    sets = MODEL + MODES[mode] + [f"data.train=[{{path=\"{prefix}\"}}]", f"train.steps={steps}",
                                  f"log.every={steps // 2}"]
    records, before, cmd, _ = train(2, sets, workdir)
    r = records[-1]
    positions = 16 * 256
    real = r["real_tokens_per_s"] if mode == "tokens" else r["tokens_per_s"]
    fill = r["real_tokens"] / positions if mode == "tokens" else 1.0
    return dict(mode=mode, real_tokens_per_s=real, positions_per_s=r["tokens_per_s"], fill=fill,
                imbalance=r.get("dp_token_imbalance", float("nan")),
                imbalance_max=r.get("dp_token_imbalance_max", float("nan")), loss=r["loss"], load=before,
                cmd=" ".join(cmd[:6] + ["<run dir>"] + cmd[8:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--median", type=float, default=120, help="median document length (bytes)")
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--json")
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(dir=args.workdir)
    prefix, lengths = make_corpus(workdir, args.docs, args.median, args.sigma, args.max_len, 1)
    q = lambda f: lengths[int(f * (len(lengths) - 1))]
    print(f"corpus: {len(lengths)} documents, lengths (bytes) min {lengths[0]} median {q(0.5)} p90 {q(0.9)} "
          f"p99 {q(0.99)} max {lengths[-1]}; seq_len 256: {sum(l > 256 for l in lengths)} documents are cut")
    print(f"dp 2, {args.steps} steps, the last {args.steps // 2} measured; 16 rows x 256 positions per step")
    print("| batching | round | real tokens/s | positions/s | fill | dp imbalance mean / max | load before |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for i in range(args.rounds):
        for mode in ("windows", "tokens"):
            r = run(mode, prefix, args.steps, workdir)
            results.append(r)
            imb = "-" if mode == "windows" else f"{100 * r['imbalance']:.2f}% / {100 * r['imbalance_max']:.2f}%"
            print(f"| {mode} | {i + 1} | {r['real_tokens_per_s']:.0f} | {r['positions_per_s']:.0f} | "
                  f"{100 * r['fill']:.1f}% | {imb} | {r['load']} |", flush=True)
    for mode in ("windows", "tokens"):
        rows = [r for r in results if r["mode"] == mode]
        print(f"median {mode}: real tokens/s {statistics.median(r['real_tokens_per_s'] for r in rows):.0f}, fill "
              f"{100 * statistics.median(r['fill'] for r in rows):.1f}%" +
              ("" if mode == "windows" else
               f", dp imbalance {100 * statistics.median(r['imbalance'] for r in rows):.2f}% (worst step "
               f"{100 * max(r['imbalance_max'] for r in rows):.2f}%)"))
        print("command:", rows[0]["cmd"])
    shutil.rmtree(workdir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
