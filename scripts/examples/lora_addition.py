#!/usr/bin/python3
"""The README's LoRA worked example, offline: a tiny GPT-2 (byte tokenizer) pre-trained on sums
written as "a+b=c" learns, with LoRA adapters only, to answer the instruction "What is a+b?" with
"c"; exact-match accuracy of greedy answers on held-out questions is measured before and after.

  1. pre-training text: every "a+b=c" for a, b in 0..N-1, one per line (`tessera prepare`, byte
     tokenizer), a full training run from scratch -> the base checkpoint;
  2. instruction records {"prompt": "What is a+b?", "response": "c"} for 80% of the pairs (the
     rest held out; the response ends with a newline, where `generate --stop-at-newline` stops),
     `tessera prepare --sft` (plain template: the loss covers the answer only);
  3. `tessera train` with checkpoint.init_from = the base and [lora] (the base frozen);
  4. `tessera generate` (greedy) on each held-out question, with the base and with the LoRA
     checkpoint: the answer is right when its leading digits are exactly c.

    cmake --build build -j2 --target tessera
    scripts/examples/lora_addition.py [--work /tmp/lora_addition] [--tessera build/tessera]

Standard library only. Measured (2026-12-06, AMD EPYC family 25 model 17, 2 cores, idle): 69 s in
all; held-out exact match 0.0% with the base, 88.8% after 1000 LoRA steps (r 8, attn.* and mlp.*).
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

MODEL = """[model]
preset = "gpt2"
n_layer = 2
n_head = 4
n_embd = 96
max_seq_len = 64
"""


def config(data, steps, lr, extra=""):
    return f"""{MODEL}
[data]
task = "tokens"
tokenizer = "byte"
document_mask = true
[[data.train]]
path = "{data}"
weight = 1.0

[train]
steps = {steps}
global_batch = 32
micro_batch = 32
seq_len = 64
eval_every = 0

[optim]
lr = {lr}
min_lr = {lr / 10}
warmup_steps = 20
weight_decay = 0.0

[checkpoint]
resume = "none"

[log]
every = 50
progress = "lines"
{extra}"""


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def accuracy(tessera, ckpt, questions):
    right = 0
    for a, b in questions:
        out = run([tessera, "generate", "--ckpt", ckpt, "--prompt", f"What is {a}+{b}?", "--max-tokens", "5",
                   "--stop-at-newline"])
        answer = re.match(r"\d*", out.split("?", 1)[1]).group(0)
        right += answer == str(a + b)
    return right / len(questions)


def last_checkpoint(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    return os.path.join(d, sorted(f for f in os.listdir(d) if f.startswith("step_"))[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tessera", default=os.path.join(ROOT, "build", "tessera"))
    p.add_argument("--work", default="/tmp/lora_addition")
    p.add_argument("--n", type=int, default=20, help="operands 0..N-1")
    p.add_argument("--base-steps", type=int, default=600)
    p.add_argument("--lora-steps", type=int, default=1000)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    w = lambda name: os.path.join(args.work, name)
    t0 = time.time()
    pairs = [(a, b) for a in range(args.n) for b in range(args.n)]
    random.Random(0).shuffle(pairs)
    held_out, train = pairs[: len(pairs) // 5], pairs[len(pairs) // 5:]

    # 1. the base: sums as plain text
    with open(w("sums.txt"), "w") as f:
        f.write("".join(f"{a}+{b}={a + b}\n" for a, b in pairs * 4))
    run([args.tessera, "prepare", "--input", w("sums.txt"), "--tokenizer", "byte", "--separator", "\\n",
         "--out", w("sums")])
    with open(w("base.toml"), "w") as f:
        f.write(config(w("sums"), args.base_steps, 3e-3))
    run([args.tessera, "train", w("base.toml"), "--run-dir", w("base")])
    base = last_checkpoint(w("base"))

    # 2. the instructions, answers only trained
    with open(w("qa.jsonl"), "w") as f:
        for a, b in train * 4:
            f.write(json.dumps({"prompt": f"What is {a}+{b}?", "response": f"{a + b}\n"}) + "\n")
    run([args.tessera, "prepare", "--sft", w("qa.jsonl"), "--tokenizer", "byte", "--out", w("qa")])

    # 3. LoRA on the frozen base
    lora = '\n[lora]\nrank = 8\nalpha = 16.0\ntargets = ["attn.*", "mlp.*"]\n'
    with open(w("lora.toml"), "w") as f:
        f.write(config(w("qa"), args.lora_steps, 1e-2, lora).replace('resume = "none"',
                                                                     f'resume = "none"\ninit_from = "{base}"'))
    run([args.tessera, "train", w("lora.toml"), "--run-dir", w("lora")])
    tuned = last_checkpoint(w("lora"))

    # 4. held-out questions, before and after
    before, after = accuracy(args.tessera, base, held_out), accuracy(args.tessera, tuned, held_out)
    print(f"held-out questions: {len(held_out)} (\"What is a+b?\", a, b < {args.n}); trained on {len(train)}")
    print(f"exact match before LoRA (the base): {100 * before:.1f}%")
    print(f"exact match after LoRA ({args.lora_steps} steps, r 8 on attn.* and mlp.*): {100 * after:.1f}%")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
