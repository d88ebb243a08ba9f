#!/usr/bin/env python3
"""Side-by-side training benchmark: tessera and PyTorch train the same model on the same CPU.

For each configuration, trains the model with `tessera train` (a generated TOML, log.every = 1,
per-step records read from metrics.jsonl) and with scripts/bench/torch_gpt.py (tessera's model
written in PyTorch, tests/reference/gpt_reference.py), in fp32, with the same batch, sequence
length, threads, AdamW settings and data (random tokens in an llm.c shard). Prints per
implementation: ms/step and tokens/s (median of the steps after warm-up), achieved GFLOP/s with
tessera's FLOPs-per-token formula (docs/architecture.md; the same count for both), MFU against a
measured fp32 GEMM peak (build/bench/gemm_bench), the tessera/PyTorch ratio, and peak resident
memory next to tessera's allocator peak and the analytic memory model.

    scripts/bench/train_bench.py                                  # everything, one round
    scripts/bench/train_bench.py --rounds 3 --json bench.json     # 3 alternating rounds, saved
    scripts/bench/train_bench.py --configs gpt2-124m --peak-gflops 140

Runs with any Python 3.9+ (standard library only); PyTorch runs under --python (default: the
benchmark venv of scripts/bench/setup_torch.sh, else /usr/bin/python3).
"""
import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LLMC_MAGIC = 20240520


@dataclasses.dataclass
class BenchConfig:
    name: str
    preset: str  # gpt2 | llama
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    batch: int  # B: sequences per step (one micro-batch, no accumulation)
    seq_len: int  # T
    n_kv_head: int = 0  # 0 = n_head

    def kv_heads(self):
        return self.n_kv_head or self.n_head

    def ffn_hidden(self):
        """tessera's default MLP width (model/config.cpp): 4C, or 8C/3 rounded up to 64 for llama."""
        if self.preset == "gpt2":
            return 4 * self.n_embd
        return ((8 * self.n_embd) // 3 + 63) // 64 * 64


CONFIGS = [
    BenchConfig("gpt2-124m", "gpt2", n_layer=12, n_head=12, n_embd=768, vocab_size=50257, batch=4, seq_len=64),
    BenchConfig("gpt2-6l-384", "gpt2", n_layer=6, n_head=6, n_embd=384, vocab_size=50257, batch=4, seq_len=256),
    # The LLaMA preset at the size of the second: RMSNorm, SwiGLU (F = 1024), RoPE, untied head,
    # grouped-query attention (2 key/value heads), LLaMA-2's 32000-token vocabulary.
    BenchConfig("llama-6l-384", "llama", n_layer=6, n_head=6, n_kv_head=2, n_embd=384, vocab_size=32000, batch=4,
                seq_len=256),
]
# Run only when named in --configs: GPT-2 124M at its own context length, where attention is a
# fifth of the step instead of a few percent.
EXTRA_CONFIGS = [
    BenchConfig("gpt2-124m-t1024", "gpt2", n_layer=12, n_head=12, n_embd=768, vocab_size=50257, batch=1,
                seq_len=1024),
]

# AdamW and clipping, tessera's defaults, given to both sides explicitly. Constant learning rate
# without warm-up, so both run the same update every step.
OPTIM = dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)


# ---- the model's arithmetic: FLOPs and memory ----

def flops_per_token(c):
    """model/config.cpp flops_per_token (docs/architecture.md): matmul FLOPs per trained token,
    forward + backward = 3x forward, LM head and the full T x T attention square counted."""
    C, F = c.n_embd, c.ffn_hidden()
    kv = c.kv_heads() * (C // c.n_head)
    mlp_mats = 3 if c.preset == "llama" else 2
    matmul_params = c.n_layer * (C * C + 2 * C * kv + C * C + mlp_mats * C * F) + C * c.vocab_size
    attention = c.n_layer * 2 * c.seq_len * C
    return 3 * (2 * matmul_params + 2 * attention)


def parameter_count(c):
    """Parameters of tessera's model (names and shapes as in tests/reference/gpt_reference.py)."""
    C, F, L, V, T = c.n_embd, c.ffn_hidden(), c.n_layer, c.vocab_size, c.seq_len
    kv = c.kv_heads() * (C // c.n_head)
    if c.preset == "gpt2":
        block = 2 * 2 * C + (C * C + C) + 2 * (kv * C + kv) + (C * C + C) + (F * C + F) + (C * F + C)
        return V * C + T * C + L * block + 2 * C  # wte (tied head), wpe, blocks, ln_f
    block = 2 * C + 2 * C * C + 2 * kv * C + 3 * C * F
    return V * C + L * block + C + V * C  # wte, blocks, ln_f, lm_head


def activation_bytes(c):
    """What one forward keeps for backward, fp32, counted from the architecture as
    tests/model/test_gpt.cpp does (no recomputation): residual stream, per block what each op
    saves (norm outputs and statistics, q, k, v, attention output and lse, MLP inputs), head."""
    BT, C, F, H, L = c.batch * c.seq_len, c.n_embd, c.ffn_hidden(), c.n_head, c.n_layer
    kv = c.kv_heads() * (C // c.n_head)
    norm = BT * C + (2 if c.preset == "gpt2" else 1) * BT
    attention = BT * C + 2 * BT * kv + BT * C + c.batch * H * c.seq_len
    mlp = (3 if c.preset == "llama" else 2) * BT * F
    block = norm + attention + BT * C + norm + mlp
    head = norm + BT * c.vocab_size + 2 * BT
    return 4 * ((L + 1) * BT * C + L * block + head)


def analytic_memory(c):
    """Bytes by category: parameters, gradients, AdamW moments (fp32), saved activations."""
    p = 4 * parameter_count(c)
    return {"params": p, "grads": p, "adamw": 2 * p, "activations": activation_bytes(c)}


# ---- machine, libraries ----

def run_text(cmd, env=None):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False).stdout
    except OSError as e:
        return f"({cmd[0]}: {e})"


def machine_info():
    lscpu = run_text(["lscpu"])
    field = lambda key: (re.search(rf"^{key}:\s*(.*)$", lscpu, re.M) or [None, "?"])[1].strip()
    flags = field("Flags").split()
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return {
        "cpu": f"{field('Model name')} (family {field('CPU family')} model {field('Model')}), "
               f"{os.cpu_count()} CPUs, hypervisor {field('Hypervisor vendor')}",
        "simd": " ".join(simd) + ("" if "avx512f" in flags else " (no avx512f)"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
    }


def tessera_info(tessera, env):
    text = run_text([tessera, "info"], env)
    blas = re.search(r"^blas: (.*)$", text, re.M)
    version = run_text(["git", "-C", ROOT, "describe", "--always", "--dirty"]).strip()
    return {"blas": blas[1] if blas else "?", "commit": version}


def torch_info(python, env):
    text = run_text([python, os.path.join(ROOT, "scripts", "bench", "torch_gpt.py"), "--info"], env)
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        sys.exit(f"{python} could not import torch: {text.strip() or 'no output'}\n"
                 "create the venv with scripts/bench/setup_torch.sh, or pass --python")


def gemm_peak(gemm_bench, threads, idle_wait, env):
    """The MFU denominator: gemm_bench's fp32 GEMM rate on a GPT-2 124M step's Linear shapes (all
    15 GEMMs, total flops / total median time) at N = 256 and 1024 tokens; the larger one."""
    cmd = [gemm_bench, "--threads", str(threads), "--no-mixed"]
    if idle_wait:
        cmd += ["--idle-wait", str(idle_wait)]
    text = run_text(cmd, env)
    totals = {int(n): float(g) for n, g in re.findall(r"^ALL\s+(\d+)\s+([\d.]+)", text, re.M)}
    fma = re.search(r"AVX2-FMA peak.*?; \d+ threads ([\d.]+) GFLOP/s", text)
    core = re.search(r"^library: (.*)$", text, re.M)
    if not totals:
        sys.exit(f"no ALL lines in the output of {gemm_bench}:\n{text}")
    return {"gflops": max(totals.values()), "by_tokens": totals, "fma_gflops": float(fma[1]) if fma else None,
            "library": core[1] if core else "?"}


# ---- running one implementation, with its memory ----

def vm_hwm_kib(pid):
    """Peak resident set so far (VmHWM) of a running process, KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)
            return int(m[1]) if m else None
    except OSError:
        return None


def cpu_seconds(pid):
    """User + system CPU seconds of a running process, all its threads."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def idle_fraction(seconds=1.0):
    """Share of all CPUs idle over the next few seconds (/proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)  # idle + iowait, total
    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return (i1 - i0) / max(1, t1 - t0)


def wait_for_idle(max_wait):
    """Waits (up to max_wait seconds) until other processes leave the CPUs at least 90% idle."""
    deadline = time.time() + max_wait
    while True:
        idle = idle_fraction()
        if idle >= 0.9 or time.time() >= deadline:
            return idle


def step_records(path):
    """Training records (they carry tokens_per_s) of a metrics.jsonl, in order."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [r for r in recs if "tokens_per_s" in r]


def run_monitored(cmd, env, log_path, metrics_path, warmup, total_steps, threads):
    """Runs cmd to completion, watching its per-step records. Returns a dict:
      exit: exit code;
      rss_steps_kib: peak RSS while training, VmHWM read when the record of the second-to-last
        step appears: after warm-up, optimizer state and steady activations, before anything the
        program does after its steps (evaluation, a checkpoint);
      rss_max_kib: peak RSS of the whole process;
      cpu_share: CPU seconds / (wall seconds x threads) over the measured steps: 1.0 when the
        process had its threads' cores to itself, less when other processes took them."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    out = {"rss_steps_kib": None, "cpu_share": None}
    start = None  # (wall, cpu) when the last warm-up step's record appeared
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if out["rss_steps_kib"] is None:
            recs = step_records(metrics_path)
            last = recs[-1]["step"] if recs else 0
            if start is None and last >= warmup:
                start = (time.perf_counter(), cpu_seconds(proc.pid))
            if last >= total_steps - 1:
                out["rss_steps_kib"] = vm_hwm_kib(proc.pid)
                cpu = cpu_seconds(proc.pid)
                if start and start[1] is not None and cpu is not None:
                    out["cpu_share"] = (cpu - start[1]) / ((time.perf_counter() - start[0]) * threads)
        time.sleep(0.05)
    out["exit"] = os.waitstatus_to_exitcode(status)
    out["rss_max_kib"] = usage.ru_maxrss
    return out


def write_llmc_shard(path, n_tokens, vocab, seed):
    """Random token ids below vocab as an llm.c GPT-2 shard (data/llmc_shard.h): both sides read it."""
    import random
    rng = random.Random(seed)
    header = [LLMC_MAGIC, 1, n_tokens] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n_tokens}H", *(rng.randrange(vocab) for _ in range(n_tokens))))


def tessera_toml(c, steps, data_path, peak_gflops, dtype="fp32", device="cpu", profile=False):
    """The benchmark's TOML: random ids, one micro-batch a step, constant learning rate, no evaluation
    or checkpoint. device and profile (train.device, train.profile) are written when not the
    defaults (scripts/bench/gpt2_tessera_cuda.py runs the GPU with it)."""
    o = OPTIM
    extra = (f'device = "{device}"\n' if device != "cpu" else "") + ("profile = true\n" if profile else "")
    return f"""# Generated by scripts/bench/train_bench.py: {c.name}
[model]
preset = "{c.preset}"
vocab_size = {c.vocab_size}
n_layer = {c.n_layer}
n_head = {c.n_head}
n_kv_head = {c.n_kv_head}
n_embd = {c.n_embd}

[data]
task = "tokens"
# Random ids, from no tokenizer: "gpt2" when the model has its 50257 ids, else "byte" (257), only so
# that model.vocab_size is not below the tokenizer's; ids are checked against model.vocab_size.
tokenizer = "{'gpt2' if c.vocab_size >= 50257 else 'byte'}"
[[data.train]]
path = "{data_path}"
weight = 1.0

[train]
steps = {steps}
global_batch = {c.batch}
micro_batch = {c.batch}
seq_len = {c.seq_len}
eval_every = 0
dtype = "{dtype}"
{extra}
[optim]
lr = {o['lr']}
min_lr = {o['lr']}
warmup_steps = 0
decay = "constant"
beta1 = {o['beta1']}
beta2 = {o['beta2']}
eps = {o['eps']}
weight_decay = {o['weight_decay']}
grad_clip = {o['grad_clip']}

[checkpoint]
resume = "none"
at_end = false

[log]
every = 1
progress = "lines"
peak_gflops = {peak_gflops}
"""


def run_tessera(c, args, workdir, tag, data_path, peak, env, dtype="fp32"):
    steps = args.warmup + args.steps
    run_dir = os.path.join(workdir, f"tessera-{tag}")
    toml = os.path.join(workdir, f"{c.name}-{dtype}.toml")
    with open(toml, "w") as f:
        f.write(tessera_toml(c, steps, data_path, peak, dtype))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    log = os.path.join(workdir, f"tessera-{tag}.log")
    if args.idle_wait:
        wait_for_idle(args.idle_wait)
    mon = run_monitored([args.tessera, "train", toml, "--run-dir", run_dir], env, log, metrics, args.warmup, steps,
                        args.threads)
    text = open(log).read()
    if mon["exit"] != 0:
        sys.exit(f"tessera failed (exit {mon['exit']}); its output ({log}):\n{text[-3000:]}")
    recs = step_records(metrics)
    seconds = [c.batch * c.seq_len / r["tokens_per_s"] for r in recs]
    # tessera's own FLOPs per token, recovered from its MFU field (mfu = tok/s x flops / peak).
    flops = [r["mfu"] * peak * 1e9 / r["tokens_per_s"] for r in recs[-1:]]
    params = re.search(r": (\d+) parameters", text)
    mems = re.findall(r"\| mem ([\d.]+ \w+) \|", text)
    shutil.rmtree(run_dir, ignore_errors=True)
    return dict(mon, step_s=seconds, alloc_peak=mems[-1] if mems else "?", params=int(params[1]) if params else None,
                flops_per_token=flops[0] if flops else None, log=log)


def run_torch(c, args, workdir, tag, data_path, env, dtype="fp32"):
    steps = args.warmup + args.steps
    metrics = os.path.join(workdir, f"torch-{tag}.jsonl")
    log = os.path.join(workdir, f"torch-{tag}.log")
    o = OPTIM
    cmd = [args.python, os.path.join(ROOT, "scripts", "bench", "torch_gpt.py"), "--preset", c.preset,
           "--vocab", str(c.vocab_size), "--layers", str(c.n_layer), "--heads", str(c.n_head),
           "--kv-heads", str(c.n_kv_head), "--embd", str(c.n_embd), "--batch", str(c.batch), "--seq", str(c.seq_len),
           "--steps", str(steps), "--threads", str(args.threads), "--data", data_path, "--metrics", metrics,
           "--lr", str(o["lr"]), "--beta1", str(o["beta1"]), "--beta2", str(o["beta2"]), "--eps", str(o["eps"]),
           "--weight-decay", str(o["weight_decay"]), "--grad-clip", str(o["grad_clip"])]
    if dtype == "bf16":
        cmd += ["--autocast", "bf16"]
    if args.torch_profile:
        cmd.append("--profile")
    if args.idle_wait:
        wait_for_idle(args.idle_wait)
    mon = run_monitored(cmd, env, log, metrics, args.warmup, steps, args.threads)
    text = open(log).read()
    if mon["exit"] != 0:
        sys.exit(f"torch_gpt.py failed (exit {mon['exit']}); its output ({log}):\n{text[-3000:]}")
    recs = step_records(metrics)
    setup = re.search(r"AdamW (\S+), attention (\S+)", text)
    return dict(mon, step_s=[r["step_s"] for r in recs], adamw=setup[1] if setup else "?",
                attention=setup[2] if setup else "?", log=log)


# ---- report ----

def mib(kib):
    return f"{kib / 1024:.0f} MiB" if kib else "?"


def summarize(c, runs, warmup, peak):
    """Median step time over the measured steps of every round (each round's warm-up dropped)."""
    measured = [s for r in runs for s in r["step_s"][warmup:]]
    per_round = [statistics.median(r["step_s"][warmup:]) for r in runs]
    step = statistics.median(measured)
    tps = c.batch * c.seq_len / step
    gflops = tps * flops_per_token(c) / 1e9
    return {"ms_per_step": 1e3 * step, "tokens_per_s": tps, "gflops": gflops, "mfu": gflops / peak,
            "ms_per_step_rounds": [1e3 * s for s in per_round], "steps_measured": len(measured),
            "ms_min": 1e3 * min(measured), "ms_max": 1e3 * max(measured),
            "cpu_share_rounds": [r["cpu_share"] for r in runs],
            "rss_steps": mib(max(r["rss_steps_kib"] or 0 for r in runs)),
            "rss_max": mib(max(r["rss_max_kib"] or 0 for r in runs))}


def cpu_share(s):
    shares = [f"{x:.2f}" for x in s["cpu_share_rounds"] if x is not None]
    return ", ".join(shares) or "?"


def print_table(results, peak):
    head = ("| config | implementation | ms/step (median) | min-max | tokens/s | GFLOP/s | MFU | tessera/torch "
            "| CPU share | peak RSS in steps | peak RSS |")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for name, r in results.items():
        t, p = r.get("tessera"), r.get("torch")
        ratio = f"{t['tokens_per_s'] / p['tokens_per_s']:.2f}x" if t and p else ""
        for impl, s in (("tessera", t), ("PyTorch", p)):
            if s:
                print(f"| {name} (B={r['batch']}, T={r['seq_len']}) | {impl} | {s['ms_per_step']:.1f} | "
                      f"{s['ms_min']:.0f}-{s['ms_max']:.0f} | {s['tokens_per_s']:.0f} | {s['gflops']:.1f} | "
                      f"{100 * s['mfu']:.1f}% | {ratio if impl == 'tessera' else ''} | {cpu_share(s)} | "
                      f"{s['rss_steps']} | {s['rss_max']} |")
    print(f"\nMFU = achieved GFLOP/s / {peak:.1f} GFLOP/s (measured fp32 GEMM peak). GFLOP/s = tokens/s x "
          "flops_per_token (docs/architecture.md), the same count for both. CPU share: CPU seconds / (wall "
          "seconds x threads) over the measured steps, per round; below 1.0 other processes took the cores.")


def print_memory(results):
    print("\n| config | parameters | params + grads + AdamW (analytic) | activations (analytic) | analytic total "
          "| tessera allocator peak | tessera peak RSS in steps | PyTorch peak RSS in steps |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        m = r["analytic_memory"]
        state = m["params"] + m["grads"] + m["adamw"]
        total = state + m["activations"]
        t, p = r.get("tessera", {}), r.get("torch", {})
        print(f"| {name} | {r['parameters']:,} | {state / 2**20:.0f} MiB | {m['activations'] / 2**20:.0f} MiB | "
              f"{total / 2**20:.0f} MiB | {r.get('tessera_alloc_peak', '?')} | {t.get('rss_steps', '')} | "
              f"{p.get('rss_steps', '')} |")


def result_of(c, runs, args, peak, dtype):
    r = {"batch": c.batch, "seq_len": c.seq_len, "config": dataclasses.asdict(c), "dtype": dtype,
         "flops_per_token": flops_per_token(c), "parameters": parameter_count(c),
         "analytic_memory": analytic_memory(c)}
    if runs["tessera"]:
        t = runs["tessera"][-1]
        # The formula here must be tessera's: check it against what tessera reports.
        for what, mine, theirs in (("flops_per_token", r["flops_per_token"], t["flops_per_token"]),
                                   ("parameters", r["parameters"], t["params"])):
            if theirs is None or abs(mine - theirs) > 1e-6 * mine:
                print(f"warning: {c.name}: {what} {mine} here, {theirs} in tessera", file=sys.stderr)
        r["tessera"] = summarize(c, runs["tessera"], args.warmup, peak["gflops"])
        r["tessera_alloc_peak"] = t["alloc_peak"]
    if runs["torch"]:
        r["torch"] = summarize(c, runs["torch"], args.warmup, peak["gflops"])
        r["torch_setup"] = {"adamw": runs["torch"][-1]["adamw"], "attention": runs["torch"][-1]["attention"]}
    r["step_s"] = {k: [x["step_s"] for x in v] for k, v in runs.items()}
    return r


def print_dtype_ratios(results):
    """bf16 tokens/s over fp32 tokens/s, per implementation, for configs run in both."""
    pairs = [(name, results[name + " bf16"]) for name in results if name + " bf16" in results]
    if not pairs:
        return
    print("\n| config | implementation | fp32 tokens/s | bf16 tokens/s | bf16 / fp32 |")
    print("|---|---|---|---|---|")
    for name, b in pairs:
        f = results[name]
        for impl, label in (("tessera", "tessera"), ("torch", "PyTorch (autocast bf16)")):
            if impl in f and impl in b:
                ft, bt = f[impl]["tokens_per_s"], b[impl]["tokens_per_s"]
                print(f"| {name} | {label} | {ft:.0f} | {bt:.0f} | {bt / ft:.2f}x |")


def default_python():
    venv = "/work/bench-venv/bin/python"
    return venv if os.path.exists(venv) else "/usr/bin/python3"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tessera", default=os.path.join(ROOT, "build", "tessera"))
    p.add_argument("--gemm-bench", default=os.path.join(ROOT, "build", "bench", "gemm_bench"))
    p.add_argument("--python", default=default_python(), help="interpreter with torch (default: %(default)s)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="steps dropped per run (default: %(default)s)")
    p.add_argument("--steps", type=int, default=10, help="measured steps per run (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=1, help="runs per implementation and config, alternating")
    p.add_argument("--configs", default=",".join(c.name for c in CONFIGS),
                   help="comma-separated subset; also: " + ",".join(c.name for c in EXTRA_CONFIGS))
    p.add_argument("--only", choices=["tessera", "torch"], help="run one implementation")
    p.add_argument("--dtypes", default="fp32",
                   help="comma-separated: fp32, bf16 (tessera train.dtype = \"bf16\"; PyTorch CPU autocast bf16); "
                        "each round runs every dtype of a config in turn (default: %(default)s)")
    p.add_argument("--peak-gflops", type=float, help="MFU denominator; default: measure with gemm_bench")
    p.add_argument("--idle-wait", type=float, default=0,
                   help="before each run, wait up to this many seconds for the CPUs to be 90%% idle")
    p.add_argument("--torch-profile", action="store_true", help="torch_gpt.py --profile: op table in its log")
    p.add_argument("--json", help="write every number (and per-step times) here")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, TOMLs, metrics)")
    args = p.parse_args()
    names = args.configs.split(",")
    known = CONFIGS + EXTRA_CONFIGS
    unknown = [n for n in names if n not in {c.name for c in known}]
    if unknown:
        p.error(f"unknown config(s) {unknown}; known: {[c.name for c in known]}")
    args.selected = [c for c in known if c.name in names]
    args.dtype_list = args.dtypes.split(",")
    if any(d not in ("fp32", "bf16") for d in args.dtype_list):
        p.error(f"--dtypes {args.dtypes}: each must be fp32 or bf16")
    return args


def main():
    args = parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    machine = machine_info()
    tinfo = tessera_info(args.tessera, env) if args.only != "torch" else {}
    pinfo = torch_info(args.python, env) if args.only != "tessera" else {}
    print(f"date: {machine['date']}; load average at start: {machine['load']}")
    print(f"machine: {machine['cpu']}; SIMD: {machine['simd']}")
    print(f"threads: {args.threads} (OMP_NUM_THREADS and torch.set_num_threads); "
          f"OPENBLAS_CORETYPE: {machine['OPENBLAS_CORETYPE']}")
    if tinfo:
        print(f"tessera: {tinfo['commit']}, blas: {tinfo['blas']}")
    if pinfo:
        print(f"torch: {pinfo['version']} ({args.python}), BLAS {pinfo['blas']}, MKL {pinfo['mkl']}, "
              f"oneDNN {pinfo['mkldnn']}, CPU capability {pinfo['cpu_capability']}")
    if args.peak_gflops:
        peak = {"gflops": args.peak_gflops, "source": "--peak-gflops"}
    else:
        peak = gemm_peak(args.gemm_bench, args.threads, args.idle_wait, env)
        print(f"GEMM peak: {peak['library']}; GPT-2 124M Linear GEMMs "
              + ", ".join(f"N={n}: {g:.1f}" for n, g in sorted(peak["by_tokens"].items()))
              + f" GFLOP/s -> MFU denominator {peak['gflops']:.1f} GFLOP/s"
              + (f" (AVX2-FMA loop: {peak['fma_gflops']:.1f})" if peak.get("fma_gflops") else ""))
    print(flush=True)

    workdir = tempfile.mkdtemp(prefix="tessera-train-bench-")
    data = os.path.join(workdir, "tokens.bin")
    write_llmc_shard(data, 1 << 20, min(c.vocab_size for c in args.selected), seed=1234)
    results = {}
    for c in args.selected:
        runs = {d: {"tessera": [], "torch": []} for d in args.dtype_list}
        for rnd in range(args.rounds):
            for dtype in args.dtype_list:  # alternating: fp32 and bf16 of one round run back to back
                tag = f"{c.name}-{dtype}-{rnd}"
                if args.only != "torch":
                    runs[dtype]["tessera"].append(run_tessera(c, args, workdir, tag, data, peak["gflops"], env, dtype))
                if args.only != "tessera":
                    runs[dtype]["torch"].append(run_torch(c, args, workdir, tag, data, env, dtype))
                done = {k: f"{1e3 * statistics.median(v[-1]['step_s'][args.warmup:]):.0f} ms/step"
                        for k, v in runs[dtype].items() if v}
                print(f"{c.name} {dtype} round {rnd + 1}/{args.rounds}: {done}", file=sys.stderr, flush=True)
        for dtype in args.dtype_list:
            results[c.name if dtype == "fp32" else f"{c.name} {dtype}"] = result_of(c, runs[dtype], args, peak, dtype)

    print_table(results, peak["gflops"])
    setups = {r["torch_setup"]["adamw"] + " AdamW, " + r["torch_setup"]["attention"] + " attention"
              for r in results.values() if "torch_setup" in r}
    if setups:
        print(f"PyTorch: eager fp32 (rows marked bf16: CPU autocast bf16), {'; '.join(sorted(setups))}.")
    print(f"Median of {args.steps} steps after {args.warmup} warm-up steps per run, {args.rounds} round(s); "
          f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    print_dtype_ratios(results)
    print_memory(results)
    print("\nAnalytic: fp32 parameters, gradients and two AdamW moments, plus what one forward saves for backward "
          "(tests/model/test_gpt.cpp's count); the allocator peak adds backward's temporaries and workspace. "
          "Peak RSS in steps: VmHWM at the second-to-last step (before anything after the last step).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "tessera": tinfo, "torch": pinfo, "peak": peak, "threads": args.threads,
                       "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds, "optim": OPTIM,
                       "results": results}, f, indent=1)
        print(f"wrote {args.json}")
    if args.keep:
        print(f"work directory kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
