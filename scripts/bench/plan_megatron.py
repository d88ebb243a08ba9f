#!/usr/bin/env python3
"""The planner at cluster scale, in simulation only (docs/planning.md, "Against published layouts"):
the GPT models of Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC21, arXiv:2104.04473), Table 1 (weak scaling on Selene's DGX A100
nodes: 8 x A100 80GB, 8 x 200 Gb/s HDR InfiniBand each; vocabulary 51,200, sequence 2048, mixed
precision, full activation recomputation). For each row: the published per-GPU throughput; the
planner's prediction for the published layout (`tessera plan --predict` on the a100-80g preset:
tp and pp as published, dp the rest, micro-batch 1, model.recompute = "full", bf16); and the layout
the planner would choose instead (`tessera plan --top 1 --dtype bf16`) with its prediction.

Throughput is compared as the paper counts it: Megatron's FLOPs per iteration (its equation 3,
recomputation included), F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)), divided by GPUs x step
time. The published step time is F / (GPUs x published TFLOP/s).

  cmake --build build -j2 --target tessera
  scripts/bench/plan_megatron.py [--rows 145.6B,1T,175B-384] [--no-search] [--markdown out.md]

Table 2's GPT-3 175B rows (PTD-P, 384/768/1536 GPUs) follow Table 1's, as 175B-<GPUs>.

The search at 3072 GPUs takes minutes on a 2-core machine (docs/planning.md); --no-search skips it.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESSERA = os.path.join(ROOT, "build", "tessera")
VOCAB, SEQ = 51200, 2048

# Table 1 of arXiv:2104.04473: (name, heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s per GPU).
TABLE_1 = [
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
# Table 2 of the same paper, its PTD-P rows for GPT-3 175B (96 layers, 96 heads, hidden 12288;
# "174.6" billion parameters there): model-parallel size 96, batch 1536, micro-batch 1, on 384, 768
# and 1536 GPUs. The table gives only tp x pp = 96: tp 8 (one DGX node) x pp 12 is assumed here.
TABLE_2 = [
    ("175B-384", 96, 12288, 96, 8, 12, 384, 1536, 153),
    ("175B-768", 96, 12288, 96, 8, 12, 768, 1536, 149),
    ("175B-1536", 96, 12288, 96, 8, 12, 1536, 1536, 141),
]


def megatron_flops(batch, layers, hidden):
    """Equation 3 of the paper: FLOPs per iteration with full recomputation."""
    return 96 * batch * SEQ * layers * hidden ** 2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def config_text(heads, hidden, layers, batch):
    return (f'[model]\npreset = "gpt2"\nvocab_size = {VOCAB}\nn_layer = {layers}\nn_head = {heads}\n'
            f'n_embd = {hidden}\nmax_seq_len = {SEQ}\n\n[train]\nglobal_batch = {batch}\nseq_len = {SEQ}\n'
            f'dtype = "bf16"\n')


def run(args):
    r = subprocess.run([TESSERA] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(" ".join(args) + ":\n" + r.stdout + r.stderr)
    return r.stdout


def predict(config, gpus, tp, pp):
    out = run(["plan", config, "--gpus", str(gpus), "--cluster", "a100-80g", "--predict", "--set", f"parallel.tp={tp}",
               "--set", f"parallel.pp={pp}", "--set", "train.micro_batch=1", "--set", 'model.recompute="full"'])
    m = re.search(r"predicted: step_s=(\S+) .* memory_bytes=(\d+)", out)
    over = "warning: the largest rank needs more" in out
    return float(m.group(1)), int(m.group(2)), over


def search(config, gpus):
    t0 = time.time()
    out = run(["plan", config, "--gpus", str(gpus), "--cluster", "a100-80g", "--top", "1", "--dtype", "bf16"])
    seconds = time.time() - t0
    rows = [l for l in out.splitlines() if re.match(r"\s+1\s+\d+", l)]
    if not rows:
        return None, None, seconds
    f = rows[0].split()
    # #, dp, tp, pp, vpp, cp, sp, zero, schedule, mb, recompute, dtype, step value, step unit, ...
    layout = f"dp {f[1]} tp {f[2]} pp {f[3]} vpp {f[4]} cp {f[5]}{' sp' if f[6] == 'y' else ''} zero {f[7]} {f[8]} mb {f[9]} {f[10]}"
    step = float(f[12]) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[f[13]]
    return layout, step, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="", help="comma-separated names (default: all)")
    ap.add_argument("--no-search", action="store_true", help="only --predict the published layouts")
    ap.add_argument("--markdown", default="", help="also write the table here")
    a = ap.parse_args()
    names = set(a.rows.split(",")) if a.rows else None
    lines = ["| model | GPUs | published layout | published TFLOP/s/GPU (step) | planner on it: TFLOP/s/GPU (step), mem GiB "
             "| planner's choice | its TFLOP/s/GPU (step) | search s |",
             "|---|---|---|---|---|---|---|---|"]
    print(lines[0], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, heads, hidden, layers, tp, pp, gpus, batch, tflops in TABLE_1 + TABLE_2:
            if names and name not in names:
                continue
            config = os.path.join(tmp, name + ".toml")
            with open(config, "w") as f:
                f.write(config_text(heads, hidden, layers, batch))
            flops = megatron_flops(batch, layers, hidden)
            published_step = flops / (gpus * tflops * 1e12)
            step, memory, over = predict(config, gpus, tp, pp)
            predicted = flops / (gpus * step) / 1e12
            cell = f"{predicted:.0f} ({step:.1f} s), {memory / 2**30:.1f}{' (over)' if over else ''}"
            choice, choice_cell, secs = "not searched", "", ""
            if not a.no_search:
                layout, cstep, s = search(config, gpus)
                secs = f"{s:.0f}"
                if layout is None:
                    choice = "none fits"
                else:
                    choice = layout
                    choice_cell = f"{flops / (gpus * cstep) / 1e12:.0f} ({cstep:.1f} s)"
            dp = gpus // (tp * pp)
            line = (f"| {name} | {gpus} | tp {tp} pp {pp} dp {dp}, batch {batch} | {tflops} ({published_step:.1f} s) | "
                    f"{cell} | {choice} | {choice_cell} | {secs} |")
            lines.append(line)
            print(line, flush=True)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
