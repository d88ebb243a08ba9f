#!/usr/bin/env python3
"""Depth up-scaling on one budget of training FLOPs: train (a) the deep model from scratch and (b)
a shallow model for part of the budget, then grow it with `tessera upscale` by each method and
train the grown model for the rest. One PNG of loss against cumulative training FLOPs per config,
and a table (markdown) of the final validation losses.

    scripts/bench/upscale_compare.py                                   # quickstart, 4 -> 6 layers
    scripts/bench/upscale_compare.py --config configs/shakespeare-gpt2.toml --small-layers 2 --deep-layers 4
    scripts/bench/upscale_compare.py --steps 60 --eval-every 20        # a short check of the script
    scripts/bench/upscale_compare.py --steps 200 --rewarm-steps 10 --in-run "expand"

FLOPs per step use tessera's count (docs/architecture.md): per token 3 x forward, forward =
2 (L (2 C^2 + 2 C kv + m C F) + C V) + 4 L T C, times global_batch x seq_len tokens per step.
A method that cannot give the deep depth from the shallow one is listed with tessera's refusal.
(c) "in-run <method>": one run of the shallow model whose [upscale] section grows it by that method
at the same step (`--in-run "ot top"`; "" skips it). The grown runs continue the shallow run's step
count; `--rewarm-steps N` restarts their learning-rate schedule at the growth with N warm-up steps
([upscale] rewarm_steps; 0 = the schedule continues). Standard library only, plus matplotlib for
the PNG (skipped without it).
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

METHODS = [  # (label, tessera upscale arguments after --layers N)
    ("solar", ["--method", "solar"]),
    ("stack", ["--method", "stack"]),
    ("interleave", ["--method", "interleave"]),
    ("expand", ["--method", "expand"]),
    ("average top", ["--method", "average", "--position", "top"]),
    ("average uniform", ["--method", "average", "--position", "uniform"]),
    ("ot top", ["--method", "ot", "--position", "top"]),
    ("ot uniform", ["--method", "ot", "--position", "uniform"]),
]


def model_of(config_text):
    """The [model] and [train] numbers the FLOPs formula needs, from a TOML file (flat keys only)."""
    section, out = None, {}
    for line in config_text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section in ("model", "train"):
            k, v = (s.strip() for s in line.split("=", 1))
            out[section + "." + k] = v.strip('"')
    return out


def flops_per_step(m, layers, vocab):
    preset = m.get("model.preset", "gpt2")
    c = int(m.get("model.n_embd", 768))
    h = int(m.get("model.n_head", 12))
    kv = int(m.get("model.n_kv_head", 0) or h) * (c // h)
    f = int(m.get("model.ffn_hidden", 0))
    if f == 0:
        f = 4 * c if preset == "gpt2" else 64 * math.ceil(8 * c / 3 / 64)
    mult = 2 if preset == "gpt2" else 3
    t = int(m.get("train.seq_len", 64))
    fwd = 2 * (layers * (2 * c * c + 2 * c * kv + mult * c * f) + c * vocab) + 4 * layers * t * c
    return 3 * fwd * t * int(m.get("train.global_batch", 32))


def records(metrics):
    with open(metrics) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def train(tessera, config, run_dir, sets, log):
    args = [tessera, "train", config, "--run-dir", run_dir]
    for s in sets:
        args += ["--set", s]
    print("  $", " ".join(args), flush=True)
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write(r.stdout)
    if r.returncode != 0:
        sys.exit(f"tessera train failed ({r.returncode}):\n{r.stdout[-2000:]}")


def vocab_of(tessera, ckpt):
    out = subprocess.run([tessera, "ckpt", "inspect", ckpt], stdout=subprocess.PIPE, text=True, check=True).stdout
    return int(re.search(r"/model/wte.weight\s+\((\d+),", out).group(1))


def curve(run_dir, flops_before, step_before, fps):
    """(FLOPs, loss) of the training records and (FLOPs, val_loss) of the evaluations."""
    train_pts, val_pts = [], []
    for r in records(os.path.join(run_dir, "metrics.jsonl")):
        x = flops_before + (r["step"] - step_before) * fps
        if "loss" in r:
            train_pts.append((x, r["loss"]))
        if "val_loss" in r:
            val_pts.append((x, r["val_loss"]))
    return train_pts, val_pts


def compare(a, config):
    name = os.path.splitext(os.path.basename(config))[0]
    out = os.path.join(a.out_dir, name)
    os.makedirs(out, exist_ok=True)
    m = model_of(open(config).read())
    steps = a.steps or int(m.get("train.steps", 1000))
    common = [f"train.eval_every={a.eval_every}", f"log.every={a.log_every}", "log.progress=lines",
              "checkpoint.resume=none", "checkpoint.overwrite=true"]
    log = open(os.path.join(out, "runs.log"), "w")
    runs = {}

    print(f"{name}: deep model ({a.deep_layers} layers) from scratch, {steps} steps")
    deep_dir = os.path.join(out, "deep")
    train(a.tessera, config, deep_dir, common + [f"model.n_layer={a.deep_layers}", f"train.steps={steps}"], log)
    vocab = vocab_of(a.tessera, os.path.join(deep_dir, "checkpoints", f"step_{steps:08d}.h5"))
    fps_deep = flops_per_step(m, a.deep_layers, vocab)
    fps_small = flops_per_step(m, a.small_layers, vocab)
    budget = steps * fps_deep
    runs["deep from scratch"] = curve(deep_dir, 0, 0, fps_deep)

    small_steps = int(a.small_fraction * budget / fps_small)
    grown_steps = int((budget - small_steps * fps_small) / fps_deep)
    print(f"{name}: shallow model ({a.small_layers} layers), {small_steps} steps, then grown: {grown_steps} steps")
    small_dir = os.path.join(out, "small")
    train(a.tessera, config, small_dir, common + [f"model.n_layer={a.small_layers}", f"train.steps={small_steps}"], log)
    small_ckpt = os.path.join(small_dir, "checkpoints", f"step_{small_steps:08d}.h5")
    small_train, small_val = curve(small_dir, 0, 0, fps_small)
    runs["shallow (before growth)"] = (small_train, small_val)
    skipped = {}
    for label, args in METHODS:
        grown = os.path.join(out, label.replace(" ", "_") + ".h5")
        if os.path.exists(grown):
            os.remove(grown)
        r = subprocess.run([a.tessera, "upscale", "--from", small_ckpt, "--layers", str(a.deep_layers), "--out", grown]
                           + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            skipped[label] = r.stdout.strip().splitlines()[-1]
            print(f"  {label}: skipped: {skipped[label]}")
            continue
        run_dir = os.path.join(out, label.replace(" ", "_"))
        train(a.tessera, config, run_dir, common[:-2] + [
            f"model.n_layer={a.deep_layers}", f"train.steps={small_steps + grown_steps}",
            f"checkpoint.resume={os.path.abspath(grown)}", f"upscale.rewarm_steps={a.rewarm_steps}"], log)
        t, v = curve(run_dir, small_steps * fps_small, small_steps, fps_deep)
        runs[label] = (t, v)
    if a.in_run in skipped:
        skipped["in-run " + a.in_run] = skipped[a.in_run]
    elif a.in_run:
        args = dict(METHODS)[a.in_run]
        sets = [f"upscale.method={json.dumps(args[1])}", f"upscale.at_step={small_steps}",
                f"upscale.layers={a.deep_layers}", f"upscale.rewarm_steps={a.rewarm_steps}"]
        if "--position" in args:
            sets.append(f"upscale.position={json.dumps(args[args.index('--position') + 1])}")
        print(f"{name}: in-run growth ({a.in_run}) at step {small_steps}")
        run_dir = os.path.join(out, "in_run")
        train(a.tessera, config, run_dir, common + [f"model.n_layer={a.small_layers}",
                                                    f"train.steps={small_steps + grown_steps}"] + sets, log)
        before = [r for r in records(os.path.join(run_dir, "metrics.jsonl")) if r.get("step", 0) <= small_steps]
        after_t, after_v = curve(run_dir, small_steps * fps_small, small_steps, fps_deep)
        pts_t = [(r["step"] * fps_small, r["loss"]) for r in before if "loss" in r]
        pts_v = [(r["step"] * fps_small, r["val_loss"]) for r in before if "val_loss" in r]
        runs["in-run " + a.in_run] = (pts_t + [p for p in after_t if p[0] > small_steps * fps_small],
                                      pts_v + [p for p in after_v if p[0] > small_steps * fps_small])
    return name, runs, skipped, budget


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found: no PNG")
        return
    fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 5), squeeze=False)
    for ax, (name, runs, _, budget) in zip(axes[0], results):
        for label, (t, v) in runs.items():
            pts = v if len(v) > 1 else t
            style = "k-" if label == "deep from scratch" else ("k:" if label.startswith("shallow") else "-")
            ax.plot([x for x, _ in pts], [y for _, y in pts], style, label=label, linewidth=1.2)
        ax.set_xlabel("training FLOPs")
        ax.set_ylabel("validation loss")
        ax.set_title(f"{name}: budget {budget:.3g} FLOPs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print("wrote", path)


def table(results):
    lines = []
    for name, runs, skipped, budget in results:
        lines += [f"\n{name} (budget {budget:.3g} training FLOPs)\n", "| run | final validation loss |", "| --- | --- |"]
        for label, (_, v) in runs.items():
            lines.append(f"| {label} | {v[-1][1]:.4f} |" if v else f"| {label} | - |")
        for label, why in skipped.items():
            lines.append(f"| {label} | skipped: {why} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tessera", default="build/tessera")
    p.add_argument("--config", action="append", help="configs (default: configs/quickstart.toml)")
    p.add_argument("--small-layers", type=int, default=4)
    p.add_argument("--deep-layers", type=int, default=6)
    p.add_argument("--steps", type=int, default=0, help="steps of the deep run (the budget); 0 = the config's")
    p.add_argument("--small-fraction", type=float, default=0.5, help="share of the budget the shallow run spends")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--out-dir", default="runs/upscale_compare")
    p.add_argument("--in-run", default="ot top", help="method label of the in-run growth run; \"\" = none")
    p.add_argument("--rewarm-steps", type=int, default=0, help="[upscale] rewarm_steps of every grown run")
    a = p.parse_args()
    results = [compare(a, c) for c in (a.config or ["configs/quickstart.toml"])]
    os.makedirs(a.out_dir, exist_ok=True)
    plot(results, os.path.join(a.out_dir, "upscale_compare.png"))
    text = table(results)
    open(os.path.join(a.out_dir, "upscale_compare.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
