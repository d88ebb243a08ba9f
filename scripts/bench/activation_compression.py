#!/usr/bin/python3
"""model.activation_compression on real text: configs/shakespeare-gpt2.toml's model and batch (4
blocks of width 128, 16 sequences of 128 tokens) on Tiny Shakespeare, by default tokenized as bytes
(--tokenizer byte:
vocabulary 257, so that the blocks, not a 50257-wide LM head, dominate time and memory; --tokenizer
gpt2 is the config as written), trained with none, bf16, int8 and lowrank, the same seed and steps,
one run after the other on this CPU. Writes the four loss curves on one plot
(docs/images/activation_compression_loss.png by default) and prints a Markdown table: final training
and validation loss, the validation loss's difference from "none", the allocator's peak (all
categories, and the activations'), and tokens/s (median over the records after the first). Then the
gradient error per parameter group (build/bench/activation_compression_grads: the same model shape at
its initialization, one batch of the text). docs/performance.md ("Compressed saved activations") has
the numbers.

    cmake --build build -j2 --target tessera activation_compression_grads
    PYTHONNOUSERSITE=1 /usr/bin/python3 scripts/bench/activation_compression.py             # 200 steps
    PYTHONNOUSERSITE=1 /usr/bin/python3 scripts/bench/activation_compression.py --steps 100 --rank 8

Needs matplotlib (Debian's python3-matplotlib under /usr/bin/python3) and the Tiny Shakespeare
text with GPT-2's BPE files (shared/data, or scripts/get_data.sh's data/).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = ("none", "bf16", "int8", "lowrank")


def sh(cmd, log=None, env=None):
    with open(log, "w") if log else open(os.devnull, "w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        text = open(log).read()[-3000:] if log else ""
        sys.exit(f"failed (exit {rc}): {' '.join(cmd)}\n{text}")


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train(args, work, data, method):
    run_dir = os.path.join(work, f"run-{method}")
    # The config with its data paths pointed at the prepared files.
    text = open(os.path.join(ROOT, "configs", "shakespeare-gpt2.toml")).read()
    text = text.replace('"data/shakespeare_val"', f'"{data}_val"').replace('path = "data/shakespeare"', f'path = "{data}"')
    text = text.replace('tokenizer = "gpt2"', f'tokenizer = "{args.tokenizer}"\nvocab_dir = "{args.vocab_dir}"')
    toml = os.path.join(work, f"{method}.toml")
    with open(toml, "w") as f:
        f.write(text)
    sets = [f"model.activation_compression={method}", f"model.activation_compression_rank={args.rank}",
            f"train.steps={args.steps}", f"train.eval_every={args.eval_every}", "log.every=10",
            f"train.seed={args.seed}", f"train.global_batch={args.batch}", f"train.seq_len={args.seq_len}"]
    cmd = [args.tessera, "train", toml, "--run-dir", run_dir]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    sh(cmd, os.path.join(work, f"{method}.log"), env)
    recs = records(os.path.join(run_dir, "metrics.jsonl"))
    steps = [r for r in recs if "tokens_per_s" in r]
    vals = [r for r in recs if "val_loss" in r]
    return dict(steps=[r["step"] for r in steps], loss=[r["loss"] for r in steps],
                val_steps=[r["step"] for r in vals], val=[r["val_loss"] for r in vals],
                tok_s=statistics.median(r["tokens_per_s"] for r in steps[1:] or steps),
                peak=max(r["memory_peak_bytes"] for r in steps),
                peak_act=max(r["peak_bytes_acts"][0] for r in steps))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tessera", default=os.path.join(ROOT, "build", "tessera"))
    p.add_argument("--grads", default=os.path.join(ROOT, "build", "bench", "activation_compression_grads"))
    p.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare.txt"))
    p.add_argument("--vocab-dir", default=os.path.join(ROOT, "..", "shared", "data", "gpt2"),
                   help="GPT-2's encoder.json and vocab.bpe")
    p.add_argument("--tokens", default=os.path.join(ROOT, "..", "shared", "data", "gpt2",
                                                    "tinyshakespeare_gpt2_u16le.bin"),
                   help="GPT-2 ids of the text, uint16 little-endian (for the gradient errors)")
    p.add_argument("--tokenizer", choices=("byte", "gpt2"), default="byte")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="train.global_batch (the config's)")
    p.add_argument("--seq-len", type=int, default=128, help="train.seq_len (the config's)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot", default=os.path.join(ROOT, "docs", "images", "activation_compression_loss.png"))
    p.add_argument("--work", default=None, help="keep the runs here (default: a temporary directory)")
    args = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    work = args.work or tempfile.mkdtemp(prefix="actcomp_")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, f"shakespeare_{args.tokenizer}")
    if not os.path.exists(data + ".bin"):
        sh([args.tessera, "prepare", "--input", args.text, "--tokenizer", args.tokenizer, "--vocab", args.vocab_dir,
            "--val-fraction", "0.1", "--out", data], os.path.join(work, "prepare.log"))
    runs = {m: train(args, work, data, m) for m in METHODS}

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for m in METHODS:
        ax.plot(runs[m]["steps"], runs[m]["loss"], label=f"{m} (train)", linewidth=1.2)
    for m in METHODS:
        ax.plot(runs[m]["val_steps"], runs[m]["val"], "o--", markersize=3, linewidth=0.8, label=f"{m} (val)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"Tiny Shakespeare ({args.tokenizer}), GPT-2 4 x 128, batch {args.batch} x {args.seq_len}: "
                 f"model.activation_compression (lowrank r = {args.rank})", fontsize=9)
    ax.legend(ncol=2, fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)

    base = runs["none"]
    print(f"{args.tokenizer} tokens, batch {args.batch} x {args.seq_len}, {args.steps} steps, seed {args.seed}, "
          f"{args.threads} threads, lowrank r = {args.rank}; plot {args.plot}")
    print("| compression | final loss | final val loss | val - none | peak memory | peak activations | tokens/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in METHODS:
        r = runs[m]
        print(f"| {m} | {r['loss'][-1]:.5f} | {r['val'][-1]:.5f} | {r['val'][-1] - base['val'][-1]:+.5f} | "
              f"{r['peak'] / 2**20:.1f} MiB | {r['peak_act'] / 2**20:.1f} MiB | {r['tok_s']:.0f} |")
    tokens, vocab = args.tokens, "50257"
    if args.tokenizer == "byte":  # the text's bytes as uint16 ids
        tokens, vocab = os.path.join(work, "bytes_u16le.bin"), "257"
        with open(args.text, "rb") as f, open(tokens, "wb") as out:
            out.write(b"".join(bytes((c, 0)) for c in f.read(16 * 129 * 2)))
    if os.path.exists(args.grads) and os.path.exists(tokens):
        out = subprocess.check_output([args.grads, tokens, "4", "4", "128", "16", "128", str(args.rank), vocab],
                                      env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        errors = json.loads(out)
        groups = sorted({g for e in errors.values() for g in e})
        print("\ngradient relative error per parameter group (initialization, one batch of 16 x 128):")
        print("| group | " + " | ".join(errors) + " |")
        print("| --- |" + " ---: |" * len(errors))
        for g in groups:
            print(f"| {g} | " + " | ".join(f"{errors[m].get(g, 0):.2e}" for m in errors) + " |")


if __name__ == "__main__":
    main()
