#!/usr/bin/python3
"""Plots a run's metrics.jsonl: loss and validation loss, learning rate, and throughput, as PNGs.

Usage: scripts/plot_metrics.py runs/quickstart [--out DIR]
Writes loss.png, lr.png and throughput.png (and accuracy.png when the run reports accuracy) into
the run directory or --out. Needs matplotlib (Debian: python3-matplotlib, run with /usr/bin/python3).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    train, evals = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            (evals if "val_loss" in r else train).append(r)
    return train, evals


def series(records, key):
    pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run directory holding metrics.jsonl (or the file itself)")
    ap.add_argument("--out", help="output directory (default: the run directory)")
    a = ap.parse_args()
    path = a.run if a.run.endswith(".jsonl") else os.path.join(a.run, "metrics.jsonl")
    if not os.path.exists(path):
        sys.exit(f"{path}: no such file (train a model first: build/tessera train configs/quickstart.toml)")
    out = a.out or os.path.dirname(os.path.abspath(path))
    os.makedirs(out, exist_ok=True)
    train, evals = load(path)
    if not train:
        sys.exit(f"{path}: no training records")

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*series(train, "loss"), label="train loss")
    if evals:
        ax.plot(*series(evals, "val_loss"), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, out, "loss.png")

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(*series(train, "lr"))
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
    save(fig, out, "lr.png")

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(*series(train, "tokens_per_s"))
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    save(fig, out, "throughput.png")

    steps, acc = series(evals, "val_accuracy")
    if acc:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(steps, [100 * x for x in acc], "o-")
        ax.set_xlabel("step")
        ax.set_ylabel("held-out accuracy (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        save(fig, out, "accuracy.png")


if __name__ == "__main__":
    main()
