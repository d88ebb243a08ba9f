#!/usr/bin/env python3
"""Compressed tensor-parallel communication (parallel.tp_comm_compression), measured three ways:

 (1) error: a small GPT-2 trained on Tiny Shakespeare (exact, tp 2 + sequence parallel) for
     --pretrain-steps, then --probe-steps more from its checkpoint per mode with
     parallel.tp_comm_compression_probe = true: every compressed collective also runs exactly, and
     metrics.jsonl gets the relative error of each layer's result (per edge, direction) and a
     histogram of the forward inputs over their row's max |x| (what the int8 grid sees): the
     histogram PNG shows how concentrated near zero the trained model's activations are.
 (2) training: the same model, seed and steps under tp 2 + sp and tp 4, each mode: loss curves on
     one plot, final validation loss against "none", tp bytes per step and step time.
 (3) the planner: `tessera plan --predict` of --plan-config on an 8-GPU H100 node (tp 8) and on
     two nodes with tp 16 across the inter-node link, per mode.

    scripts/bench/tp_comm_compression.py                                   # all three, defaults
    scripts/bench/tp_comm_compression.py --steps 60 --pretrain-steps 40 --probe-steps 5   # a quick check
    scripts/bench/tp_comm_compression.py --only train --tokenizer byte --layouts tp2+sp --steps 300
        # (2) on the text as bytes (vocabulary 257, as scripts/bench/activation_compression.py: the
        # blocks, whose collectives are compressed, dominate instead of a 50257-wide LM head)

Writes <out-dir>/{tp_comm_compression.md, tp_comm_loss.png, tp_comm_hist.png}. Standard library
plus matplotlib (the PNGs are skipped without it). Ranks run under `mpiexec -n N`.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys

MODES = ["none", "bf16", "int8", "int8-ef"]
LAYOUTS = [("tp2+sp", 2, True), ("tp4", 4, False)]


def run(args, log):
    with open(log, "w") as f:
        r = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(args)}\n  see {log}")


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def prepare(a):
    if os.path.exists(a.data + ".bin"):
        return
    os.makedirs(os.path.dirname(a.data) or ".", exist_ok=True)
    run([a.tessera, "prepare", "--input", a.text, "--tokenizer", a.tokenizer, "--vocab", a.vocab, "--val-fraction",
         "0.1", "--out", a.data], a.data + ".prepare.log")


def train(a, run_dir, ranks, sets):
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each call (its checkpoints too)
    os.makedirs(run_dir, exist_ok=True)
    args = ["mpiexec", "-n", str(ranks), a.tessera, "train", a.config, "--run-dir", run_dir,
            "--set", f"data.valid={a.data}_val", "--set", f"data.train=[{{path=\"{a.data}\", weight=1.0}}]",
            "--set", "log.progress=\"lines\"", "--set", "checkpoint.resume=\"none\"",
            "--set", f"data.tokenizer=\"{a.tokenizer}\"", "--set", f"data.vocab_dir=\"{a.vocab}\""]
    for s in a.set + sets:
        args += ["--set", s]
    run(args, os.path.join(run_dir, "train.log"))
    return records(run_dir)


def layout_sets(tp, sp):
    return [f"parallel.tp={tp}", f"parallel.sequence_parallel={'true' if sp else 'false'}"]


# ---- (1) error on a trained model's activations ------------------------------------------------

def error_study(a):
    base = os.path.join(a.out_dir, "pretrain")
    ckpt = os.path.join(base, "checkpoints", f"step_{a.pretrain_steps:08d}.h5")
    if not os.path.exists(ckpt):  # a checkpoint of an earlier call is reused
        train(a, base, 2, layout_sets(2, True) + [f"train.steps={a.pretrain_steps}", f"train.eval_every={a.pretrain_steps}",
                                                 f"checkpoint.dir=\"{base}/checkpoints\"", "checkpoint.every=0"])
    out = {}
    for mode in ["bf16", "int8", "int8-ef"]:
        d = os.path.join(a.out_dir, f"probe_{mode}")
        recs = train(a, d, 2, layout_sets(2, True) + [
            f"checkpoint.init_from=\"{ckpt}\"", "checkpoint.at_end=false", f"train.steps={a.probe_steps}", "train.eval_every=0",
            f"log.every={a.probe_steps}", "optim.warmup_steps=0", "optim.lr=1e-4", "optim.min_lr=1e-4",
            f"parallel.tp_comm_compression=\"{mode}\"", "parallel.tp_comm_compression_probe=true"])
        last = [r for r in recs if "tp_comm_value_hist" in r][-1]
        out[mode] = last
    return out


EDGES = [("forward_enter", "fwd all-gather"), ("forward_leave", "fwd reduce-scatter"),
         ("backward_leave", "bwd all-gather"), ("backward_enter", "bwd reduce-scatter")]


def value(rec, key, site):
    v = rec.get(key) or []
    return v[site] if site < len(v) else None


def error_table(probes):
    """Per site and collective: the per-step relative error, and that of the results summed over the
    probed steps (what error feedback bounds), of each mode."""
    lines = ["| site (layer.part) | collective | " + " | ".join(f"{m} per step" for m in probes) + " | " +
             " | ".join(f"{m} summed" for m in probes) + " |", "|---|---|" + "---|" * (2 * len(probes))]
    sites = max(len(probes[m].get("tp_comm_rel_error_" + k) or []) for m in probes for k, _ in EDGES)
    fmt = lambda v: "-" if v is None else f"{v:.2e}"
    for s in range(sites):
        name = f"{s // 2}.{'attn' if s % 2 == 0 else 'mlp'}"
        for k, label in EDGES:
            per = [fmt(value(probes[m], "tp_comm_rel_error_" + k, s)) for m in probes]
            summed = [fmt(value(probes[m], "tp_comm_rel_error_summed_" + k, s)) for m in probes]
            lines.append(f"| {name} | {label} | " + " | ".join(per) + " | " + " | ".join(summed) + " |")
    return "\n".join(lines)


def error_means(probes):
    """The mean over sites of each edge's errors, per mode."""
    lines = ["| collective | " + " | ".join(f"{m} per step" for m in probes) + " | " +
             " | ".join(f"{m} summed" for m in probes) + " |", "|---|" + "---|" * (2 * len(probes))]
    for k, label in EDGES:
        row = []
        for prefix in ("tp_comm_rel_error_", "tp_comm_rel_error_summed_"):
            for m in probes:
                v = [x for x in probes[m].get(prefix + k) or [] if x is not None]
                row.append(f"{statistics.mean(v):.2e}" if v else "-")
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot_hist(hist, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    n = len(hist)
    total = sum(hist)
    centers = [-1 + (i + 0.5) * 2 / n for i in range(n)]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(centers, [h / total for h in hist], width=2 / n)
    ax.set_yscale("log")
    ax.set_xlabel("value / max |value| of its row (the int8 grid: steps of 1/127)")
    ax.set_ylabel("fraction of values")
    ax.set_title("forward tp inputs, trained Shakespeare GPT-2 (tp 2 + sp)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- (2) training comparison ------------------------------------------------------------------

def training_study(a):
    results = {}
    for label, tp, sp in a.layouts:
        for mode in MODES:
            d = os.path.join(a.out_dir, f"train_{label}_{mode}")
            recs = train(a, d, tp, layout_sets(tp, sp) + [
                f"train.steps={a.steps}", f"train.eval_every={a.eval_every}", f"log.every={a.log_every}",
                f"parallel.tp_comm_compression=\"{mode}\""])
            results[(label, mode)] = recs
    return results


def summarize(recs, tokens_per_step):
    steps = [r for r in recs if "loss" in r and "tokens_per_s" in r]
    evals = [r for r in recs if "val_loss" in r]
    tps = statistics.median(r["tokens_per_s"] for r in steps[1:] or steps)
    tp_bytes = statistics.median(r.get("tp_bytes_per_step", 0) for r in steps[1:] or steps)
    return {"val": evals[-1]["val_loss"] if evals else float("nan"), "step_s": tokens_per_step / tps,
            "tp_bytes": tp_bytes, "curve": [(r["step"], r["loss"]) for r in steps],
            "peak": max(r.get("memory_peak_bytes", 0) for r in steps), "loss": steps[-1]["loss"]}


def plot_losses(summary, layouts, title, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(layouts), figsize=(6 * len(layouts), 4), sharey=True, squeeze=False)
    fig.suptitle(title, fontsize=9)
    for ax, (label, _, _) in zip(axes[0], layouts):
        for mode in MODES:
            c = summary[(label, mode)]["curve"]
            ax.plot([s for s, _ in c], [l for _, l in c], label=mode)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.legend()
    axes[0][0].set_ylabel("training loss")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def training_table(summary, layouts):
    lines = ["| layout | mode | final loss | final val loss | vs none | tp bytes/step/rank | vs none | "
             "peak memory (rank 0) | step time (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, _, _ in layouts:
        ref = summary[(label, "none")]
        for mode in MODES:
            s = summary[(label, mode)]
            lines.append(f"| {label} | {mode} | {s['loss']:.4f} | {s['val']:.4f} | {s['val'] - ref['val']:+.4f} | "
                         f"{s['tp_bytes']:.0f} | {s['tp_bytes'] / ref['tp_bytes']:.3f} | {s['peak'] / 2**20:.1f} MiB | "
                         f"{s['step_s']:.3f} |")
    return "\n".join(lines)


# ---- (3) the planner --------------------------------------------------------------------------

def plan_study(a):
    cases = [("8 x H100 node, tp 8 + sp", 8, ["parallel.tp=8", "parallel.sequence_parallel=true"]),
             ("2 nodes x 8 H100, tp 16 + sp across nodes", 16, ["parallel.tp=16", "parallel.sequence_parallel=true"])]
    lines = ["| job | mode | predicted step (s) | tp bytes/step/rank | gain vs none |", "|---|---|---|---|---|"]
    for label, gpus, sets in cases:
        ref = None
        for mode in MODES:
            args = [a.tessera, "plan", a.plan_config, "--gpus", str(gpus), "--cluster", a.cluster, "--predict",
                    "--set", f"train.micro_batch={a.plan_micro_batch}", "--set", f"parallel.tp_comm_compression=\"{mode}\""]
            for s in sets:
                args += ["--set", s]
            out = subprocess.run(args, capture_output=True, text=True)
            m = re.search(r"predicted: step_s=(\S+) .*tp_bytes=(\S+)", out.stdout)
            if not m:
                sys.exit(f"tessera plan gave no prediction:\n{' '.join(args)}\n{out.stdout}\n{out.stderr}")
            step, tpb = float(m.group(1)), float(m.group(2))
            ref = ref or step
            lines.append(f"| {label} | {mode} | {step:.4f} | {tpb:.3e} | {100 * (ref - step) / ref:.1f}% |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tessera", default="build/tessera")
    p.add_argument("--config", default="configs/shakespeare-gpt2.toml")
    p.add_argument("--text", default="/work/shared/data/tinyshakespeare.txt")
    p.add_argument("--vocab", default="/work/shared/data/gpt2", help="GPT-2 encoder.json + vocab.bpe")
    p.add_argument("--tokenizer", choices=("gpt2", "byte"), default="gpt2")
    p.add_argument("--layouts", default="tp2+sp,tp4", help="the training study's layouts: " +
                   ", ".join(l for l, _, _ in LAYOUTS))
    p.add_argument("--data", default="runs/tp_comm_compression/data/shakespeare")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--pretrain-steps", type=int, default=300)
    p.add_argument("--probe-steps", type=int, default=10)
    p.add_argument("--plan-config", default="configs/gpt2-350m.toml")
    p.add_argument("--plan-micro-batch", type=int, default=4)
    p.add_argument("--cluster", default="h100-sxm-80g")
    p.add_argument("--set", action="append", default=[], help="a config override for every training run "
                   "(e.g. train.global_batch=8 on a small machine)")
    p.add_argument("--only", default="error,train,plan", help="which studies, comma-separated")
    p.add_argument("--out-dir", default="runs/tp_comm_compression")
    a = p.parse_args()
    a.layouts = [l for l in LAYOUTS if l[0] in a.layouts.split(",")]
    if a.tokenizer != "gpt2" and a.data == p.get_default("data"):
        a.data += "_" + a.tokenizer
    os.makedirs(a.out_dir, exist_ok=True)
    only = set(a.only.split(","))
    report = []
    if "plan" in only:
        report += ["## Planner (tessera plan --predict, " + a.plan_config + f", micro_batch {a.plan_micro_batch}, "
                   f"cluster {a.cluster})", "", plan_study(a), ""]
    if only & {"error", "train"}:
        prepare(a)
    if "error" in only:
        probes = error_study(a)
        report += [f"## Relative error per layer (trained {a.pretrain_steps} steps, then {a.probe_steps} probed steps "
                   "per mode; per step: ||compressed - exact|| / ||exact|| over the probed steps' results; summed: "
                   "the same of the results summed over the probed steps)", "", "Mean over the layers:", "",
                   error_means(probes), "", "Per layer:", "", error_table(probes), ""]
        hist = probes["int8"]["tp_comm_value_hist"]
        n, total = len(hist), sum(hist)
        near = sum(h for i, h in enumerate(hist) if abs(-1 + (i + 0.5) * 2 / n) < 0.1) / total
        report += [f"Forward inputs within 0.1 x their row's max |x|: {100 * near:.1f}% of {total:.0f} values "
                   "(int8: 12 of its 255 levels).", ""]
        plot_hist(hist, os.path.join(a.out_dir, "tp_comm_hist.png"))
    if "train" in only:
        results = training_study(a)
        cfg = open(a.config).read()
        for o in a.set:  # the overrides win over the file
            cfg += "\n" + o.split(".", 1)[-1]
        gb = int(re.findall(r"global_batch\s*=\s*(\d+)", cfg)[-1])
        sl = int(re.findall(r"seq_len\s*=\s*(\d+)", cfg)[-1])
        summary = {k: summarize(v, gb * sl) for k, v in results.items()}
        report += [f"## Training ({a.config}, {a.tokenizer} tokens, batch {gb} x {sl}, {a.steps} steps, same seed)", "",
                   training_table(summary, a.layouts), ""]
        plot_losses(summary, a.layouts, f"Tiny Shakespeare ({a.tokenizer}), GPT-2 4 x 128, batch {gb} x {sl}: "
                    "parallel.tp_comm_compression", os.path.join(a.out_dir, "tp_comm_loss.png"))
    text = "\n".join(report)
    open(os.path.join(a.out_dir, "tp_comm_compression.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
