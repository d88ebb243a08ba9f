#!/usr/bin/env python3
"""The planner against measured runs on this machine's ranks (docs/plan_validation.md).

For each model (a small GPT-2 and a small LLaMA with grouped-query attention, both on the addition
task) and each rank count: calibrates the ranks at the model's shapes (`mpiexec -n R tessera plan
--calibrate CONFIG --set ...`: GEMMs and every other op family by shape, the collectives), then
plans (`tessera plan --top K`) and runs every layout of the planner's top K and a fixed list that
covers every axis (dp, tp + sp, pp with each schedule, cp ring and all-gather, ZeRO-1, recomputation
none / selective / full / bubble, bf16) under `mpiexec` (one OpenMP thread per rank; --rounds
times, interleaved, the median kept), with `tessera plan --predict` for each. It prints and
records, per model and rank count: predicted against measured step time, median |error|, the
largest error, Spearman's rank correlation, where the planner's top choice landed against the
fastest measured, the bytes each group sent per step (the trainer's counters), predicted device
memory against the allocator's measured peak, and the load average around every run (the machine
is shared). --docs writes docs/plan_validation.md and docs/plan_validation.png (predicted against
measured).

  cmake --build build -j2 --target tessera
  scripts/bench/plan_validate.py [--ranks 2,4] [--models gpt2,llama] [--rounds 3] [--top 20] [--docs]
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESSERA = os.path.join(ROOT, "build", "tessera")
CONFIG = os.path.join(ROOT, "configs", "quickstart.toml")
COMMON = ["train.seq_len=64", "model.max_seq_len=64", "train.global_batch=32", "train.eval_every=0",
          "data.val_examples=8", "train.eval_batches=1", "optim.warmup_steps=2", "checkpoint.at_end=false"]
MODELS = {
    # A 4-layer C = 256 GPT-2 (3.2M parameters), 32 sequences of 64 tokens a step.
    "gpt2": ['model.preset="gpt2"', "model.n_layer=4", "model.n_embd=256", "model.n_head=4"] + COMMON,
    # A 4-layer C = 256 LLaMA (RMSNorm, SwiGLU, RoPE), 4 query heads over 2 KV heads.
    "llama": ['model.preset="llama"', "model.n_layer=4", "model.n_embd=256", "model.n_head=4",
              "model.n_kv_head=2"] + COMMON,
}

MB4 = ["train.micro_batch=4"]
# (name, keys): every axis and option the planner chooses.
COVER = {
    2: [
        ("dp2", MB4),
        ("dp2 mb2", ["train.micro_batch=2"]),
        ("dp2 mb16", ["train.micro_batch=16"]),
        ("dp2 zero1", MB4 + ["parallel.zero=1"]),
        ("dp2 selective", MB4 + ['model.recompute="selective"']),
        ("dp2 full", MB4 + ['model.recompute="full"']),
        ("dp2 bf16", MB4 + ['train.dtype="bf16"']),
        ("tp2", ["parallel.tp=2"] + MB4),
        ("tp2 sp", ["parallel.tp=2", "parallel.sequence_parallel=true"] + MB4),
        ("pp2 1f1b", ["parallel.pp=2"] + MB4),
        ("pp2 gpipe", ["parallel.pp=2", 'parallel.pp_schedule="gpipe"'] + MB4),
        ("pp2 zb-h1", ["parallel.pp=2", 'parallel.pp_schedule="zb-h1"'] + MB4),
        ("pp2 interleaved", ["parallel.pp=2", 'parallel.pp_schedule="interleaved"', "parallel.vpp=2"] + MB4),
        ("pp2 1f1b bubble", ["parallel.pp=2", 'model.recompute="bubble"'] + MB4),
        ("cp2 ring", ["parallel.cp=2"] + MB4),
        ("cp2 allgather", ["parallel.cp=2", 'parallel.cp_comm="allgather"'] + MB4),
    ],
    4: [
        ("dp4", MB4),
        ("dp4 zero1", MB4 + ["parallel.zero=1"]),
        ("dp4 selective", MB4 + ['model.recompute="selective"']),
        ("dp4 bf16", MB4 + ['train.dtype="bf16"']),
        ("dp2 tp2 sp", ["parallel.tp=2", "parallel.sequence_parallel=true"] + MB4),
        ("tp4", ["parallel.tp=4"] + MB4),
        ("tp2 pp2", ["parallel.tp=2", "parallel.pp=2"] + MB4),
        ("pp4 1f1b", ["parallel.pp=4"] + MB4),
        ("pp4 gpipe", ["parallel.pp=4", 'parallel.pp_schedule="gpipe"'] + MB4),
        ("pp4 zb-h1", ["parallel.pp=4", 'parallel.pp_schedule="zb-h1"'] + MB4),
        ("dp2 pp2 interleaved", ["parallel.pp=2", 'parallel.pp_schedule="interleaved"', "parallel.vpp=2"] + MB4),
        ("dp2 pp2 bubble", ["parallel.pp=2", 'model.recompute="bubble"'] + MB4),
        ("dp2 pp2 full", ["parallel.pp=2", 'model.recompute="full"'] + MB4),
        ("dp2 cp2 ring", ["parallel.cp=2"] + MB4),
        ("dp2 cp2 allgather", ["parallel.cp=2", 'parallel.cp_comm="allgather"'] + MB4),
        ("tp2 cp2", ["parallel.tp=2", "parallel.cp=2"] + MB4),
    ],
}


def sh(cmd, env=None, fatal=True):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        if fatal:
            sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
        print(f"failed (layout dropped): {' '.join(cmd)}\n{out.stderr[-2000:]}", flush=True)
        return None
    return out.stdout


def sets(model, keys):
    return [a for k in MODELS[model] + keys for a in ("--set", k)]


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_times():
    """(nice, total) jiffies of all CPUs from /proc/stat: the share of the machine that niced jobs
    (other work run under `nice -n 19` beside the measurements) took between two readings."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[1], sum(v)


def cpu():
    name, flags = "?", ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = " ".join(sorted(x for x in line.split(":", 1)[1].split() if x.startswith("avx")))
    return name, flags


def calibrate(model, ranks, path):
    t0 = time.time()
    out = sh(["mpiexec", "-n", str(ranks), TESSERA, "plan", "--calibrate", CONFIG, "--out", path] + sets(model, []),
             dict(os.environ, OMP_NUM_THREADS="1"))
    return out, time.time() - t0


def measure(model, ranks, keys, steps, workdir):
    run_dir = tempfile.mkdtemp(dir=workdir)
    cmd = ["mpiexec", "-n", str(ranks), TESSERA, "train", CONFIG, "--run-dir", run_dir] + \
        sets(model, keys + [f"train.steps={steps}", "log.every=2"])
    if sh(cmd, dict(os.environ, OMP_NUM_THREADS="1"), fatal=False) is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    shutil.rmtree(run_dir)
    r = records[-1]  # the last 2 steps (the first records warm up)
    # the largest pipeline rank's peak (the estimate is the largest rank's); rank 0's where not recorded
    peak = max((max(rec.get("peak_bytes_by_stage", [rec.get("memory_peak_bytes", 0)])) for rec in records), default=0)
    return {"step_s": 32 * 64 / r["tokens_per_s"], "tp": r.get("tp_bytes_per_step", 0),
            "cp": r.get("cp_bytes_per_step", 0), "pp": r.get("pp_bytes_per_step", 0),
            "dp": r.get("dp_bytes_per_step", 0), "peak": peak}


def predict(model, ranks, keys, cluster):
    out = sh([TESSERA, "plan", CONFIG, "--gpus", str(ranks), "--cluster", cluster, "--predict"] + sets(model, keys))
    line = [l for l in out.splitlines() if l.startswith("predicted: ")][-1]
    v = dict(kv.split("=") for kv in line[len("predicted: "):].split())
    return {"step_s": float(v["step_s"]), "tp": float(v["tp_bytes"]), "cp": float(v["cp_bytes"]),
            "pp": float(v["pp_bytes"]), "dp": float(v["dp_bytes"]), "device": float(v.get("device_bytes", 0))}


ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([y-])\s+(\d)\s+(\S+)\s+(\d+)\s+(\S+)\s+(fp32|bf16)\s")


def keys_of_row(m):
    """A row of `tessera plan`'s table as the --set keys that make train run it."""
    _, dp, tp, pp, vpp, cp, sp, zero, schedule, mb, recompute, dtype = m.groups()
    keys = [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.cp={cp}", f"parallel.zero={zero}",
            f"train.micro_batch={mb}", f'train.dtype="{dtype}"']
    if sp == "y":
        keys.append("parallel.sequence_parallel=true")
    kind = schedule.split("/")[0]
    if int(pp) > 1:
        keys.append(f'parallel.pp_schedule="{kind}"')
        if int(vpp) > 1:
            keys.append(f"parallel.vpp={vpp}")
    if schedule.endswith("/ag"):
        keys.append('parallel.cp_comm="allgather"')
    if recompute.startswith("bubble+"):  # bubble+2a: model.recompute_ahead = 2
        keys.append('model.recompute="bubble"')
        keys.append(f"model.recompute_ahead={recompute[len('bubble+'):-1]}")
    elif "+" in recompute:  # none+2f, sel+2f
        base, *parts = recompute.split("+")
        if len(parts) != 1 or not re.fullmatch(r"\d+f", parts[0]):
            return None  # per-op sets per block (none+2f+3nm): not run here (they need the stage cut's layers)
        keys.append('model.recompute="%s"' % ("selective" if base == "sel" else "none"))
        keys.append(f"model.recompute_layers={parts[0][:-1]}")
    else:
        keys.append(f'model.recompute="{recompute}"')
    name = f"dp{dp} tp{tp}{'sp' if sp == 'y' else ''} pp{pp}" + (f"v{vpp}" if int(vpp) > 1 else "") + \
        f" cp{cp} z{zero} {schedule} mb{mb} {recompute} {dtype}"
    return name, keys


def planner_top(model, ranks, cluster, top):
    out = sh([TESSERA, "plan", CONFIG, "--gpus", str(ranks), "--cluster", cluster, "--top", str(top)] + sets(model, []))
    rows = [keys_of_row(m) for m in (ROW.match(line) for line in out.splitlines()) if m]
    if None in rows:
        print(f"{rows.count(None)} of the top {top} recompute per-op sets per block: not run", flush=True)
    return [r for r in rows if r is not None], out


def ranks_of(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks_of(a), ranks_of(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va > 0 and vb > 0 else float("nan")


def canonical(keys):
    """The layout a key list runs (defaults filled), to run a layout named twice only once."""
    d = {"parallel.tp": "1", "parallel.pp": "1", "parallel.cp": "1", "parallel.zero": "0", "parallel.vpp": "1",
         "parallel.sequence_parallel": "false", "parallel.pp_schedule": '"1f1b"', "parallel.cp_comm": '"ring"',
         "model.recompute": '"none"', "model.recompute_layers": "0", "train.dtype": '"fp32"'}
    for k in keys:
        a, b = k.split("=", 1)
        d[a] = b
    if d["parallel.pp"] == "1":
        d["parallel.pp_schedule"] = '"1f1b"'
        if d["model.recompute"] == '"bubble"':
            d["model.recompute"] = '"full"'
    if d["parallel.cp"] == "1":
        d["parallel.cp_comm"] = '"ring"'
    return tuple(sorted(d.items()))


def summarize(rows, choice_name):
    errors = [abs(r["error"]) for r in rows]
    pred = [r["predicted"]["step_s"] for r in rows]
    meas = [r["measured"]["step_s"] for r in rows]
    fastest = min(rows, key=lambda r: r["measured"]["step_s"])
    top = next((r for r in rows if r["name"] == choice_name), None)
    mem = [r["predicted"]["device"] / r["measured"]["peak"] - 1 for r in rows if r["measured"]["peak"] > 0]
    return {
        "layouts": len(rows),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "worst": max(rows, key=lambda r: abs(r["error"]))["name"],
        "spearman": spearman(pred, meas),
        "fastest": fastest["name"], "fastest_s": fastest["measured"]["step_s"],
        "choice": choice_name,
        "choice_vs_fastest": (top["measured"]["step_s"] / fastest["measured"]["step_s"] - 1) if top else None,
        "memory_error_min": min(mem) if mem else None, "memory_error_max": max(mem) if mem else None,
    }


def run_case(model, ranks, args, workdir):
    cluster = os.path.join(workdir, f"local-{model}-{ranks}.toml")
    cal_out, cal_s = calibrate(model, ranks, cluster)
    print(f"\n== {model} on {ranks} ranks: calibrated in {cal_s:.0f} s", flush=True)
    top, plan_out = planner_top(model, ranks, cluster, args.top)
    layouts, seen = [], set()
    for name, keys in [(f"top{i + 1}: {n}", k) for i, (n, k) in enumerate(top)] + COVER[ranks]:
        c = canonical(keys)
        if c in seen:
            for l in layouts:
                if canonical(l[1]) == c and name not in l[0]:
                    l[0] += f" = {name}"
            continue
        seen.add(c)
        layouts.append([name, keys])
    choice = layouts[0][0] if top else None
    rows = []
    for name, keys in layouts:
        rows.append(dict(name=name, keys=keys, predicted=predict(model, ranks, keys, cluster), runs=[], loads=[]))
    for _ in range(args.rounds):  # rounds interleaved: a change of load hits every layout alike
        for r in rows:
            if r.get("failed"):
                continue
            before, (nice0, total0) = load(), cpu_times()
            m = measure(model, ranks, r["keys"], args.steps, workdir)
            if m is None:
                r["failed"] = True
                continue
            nice1, total1 = cpu_times()
            r["runs"].append(m)
            r["loads"].append((before + load()) / 2)
            r.setdefault("nice_share", []).append((nice1 - nice0) / max(1, total1 - total0))
    dropped = [r["name"] for r in rows if r.get("failed")]
    rows = [r for r in rows if not r.get("failed")]
    for r in rows:
        r["measured"] = {k: statistics.median(x[k] for x in r["runs"]) for k in r["runs"][0]}
        if "parallel.zero=1" in r["keys"]:
            # ZeRO-1's estimate keeps the moments' gather for a checkpoint (any step may write one);
            # the timed runs write none, so its peak is taken from a 2-step run that writes one at step 1.
            m = measure(model, ranks, r["keys"] + ["checkpoint.every=1"], 2, workdir)
            if m is not None:
                r["measured"]["peak"] = m["peak"]
                r["peak_with_checkpoint"] = True
        r["error"] = r["predicted"]["step_s"] / r["measured"]["step_s"] - 1
        p, m = r["predicted"], r["measured"]
        print(f"| {r['name']} | {1e3 * p['step_s']:.1f} | {1e3 * m['step_s']:.1f} "
              f"({runs_text(r)}) | {100 * r['error']:+.0f}% | "
              f"{p['device'] / 2**20:.1f} / {m['peak'] / 2**20:.1f} | "
              f"{' '.join(f'{x:.1f}' for x in r['loads'])} |", flush=True)
    s = summarize(rows, choice)
    print(json.dumps(s, indent=1), flush=True)
    return dict(model=model, ranks=ranks, dropped=dropped, calibration=cal_out, calibration_s=cal_s, cluster=open(cluster).read(),
                plan=plan_out, rows=rows, summary=s)


def runs_text(row):
    return ", ".join("%.0f" % (1e3 * x["step_s"]) for x in row["runs"])


def nice_text(row):
    """The CPU share niced jobs took during each round, where the run recorded it."""
    if not row.get("nice_share"):
        return ""
    return " (niced " + " ".join(f"{100 * x:.0f}%" for x in row["nice_share"]) + ")"


def pct(x):
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def write_docs(cases, command, cpu_name, flags, started, path_md, path_png):
    lines = ["# The planner against measured runs", "",
             "Written by `scripts/bench/plan_validate.py --docs` (the commands below); every number in its tables",
             "comes from those runs. The issue's targets (issue 30): median |error| <= 15%, no layout off by",
             "more than 35%, Spearman >= 0.8, the planner's top choice within 10% of the fastest measured, memory",
             "at most 5% above the measured peak. Each line of the summary says which it meets.", "",
             f"    {command}", "",
             f"CPU: {cpu_name} ({flags}); {os.cpu_count()} cores; the load average",
             f"(1 minute) at the start was {started:.1f}, and each layout's loads are in its row (with the CPU share",
             "that other jobs running at nice 19 took during each round, where recorded). One OpenMP",
             "thread per rank. Step times: the median over the rounds (interleaved) of the last metrics record",
             "(2 steps); memory: the planner's device bytes of the largest rank against the allocator's peak",
             "of the largest pipeline rank (`peak_bytes_by_stage`; with dp, tp or cp: their rank 0's); for ZeRO-1 layouts",
             "from a separate 2-step run that writes a checkpoint at step 1, because the estimate keeps the",
             "moments' gather a checkpoint needs and the timed runs write none).", ""]
    lines += ["| model | ranks | layouts | median abs error | max error | Spearman | top choice vs fastest | memory pred/meas - 1 | targets met |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        s = c["summary"]
        met = []
        met.append("median" if s["median_abs_error"] <= 0.15 else "")
        met.append("max" if s["max_abs_error"] <= 0.35 else "")
        met.append("rank" if s["spearman"] >= 0.8 else "")
        met.append("choice" if s["choice_vs_fastest"] is not None and s["choice_vs_fastest"] <= 0.10 else "")
        met.append("memory" if s["memory_error_min"] is not None and s["memory_error_min"] >= 0
                   and s["memory_error_max"] <= 0.05 else "")
        met = ", ".join(m for m in met if m) or "none"
        lines.append(f"| {c['model']} | {c['ranks']} | {s['layouts']} | {100 * s['median_abs_error']:.1f}% | "
                     f"{100 * s['max_abs_error']:.1f}% ({s['worst']}) | {s['spearman']:.2f} | "
                     f"{pct(s['choice_vs_fastest'])} | {pct(s['memory_error_min'])} .. {pct(s['memory_error_max'])} | {met} |")
    lines += ["", f"![predicted against measured step time]({os.path.basename(path_png)})", ""]
    for c in cases:
        lines += [f"## {c['model']} on {c['ranks']} ranks", "",
                  f"Calibration ({c['calibration_s']:.0f} s): `mpiexec -n {c['ranks']} tessera plan --calibrate` "
                  "at the model's shapes; its log:", "", "```"] + c["calibration"].strip().splitlines() + ["```", "",
                  ("Dropped (training failed): " + ", ".join(c["dropped"]) + "." if c["dropped"] else ""), "",
                  "| layout | predicted ms | measured ms (median; rounds) | error | device MiB pred / peak | tp MB/step pred / meas | load |",
                  "|---|---|---|---|---|---|---|"]
        for r in c["rows"]:
            p, m = r["predicted"], r["measured"]
            lines.append(f"| {r['name']} | {1e3 * p['step_s']:.1f} | {1e3 * m['step_s']:.1f} "
                         f"({runs_text(r)}) | {100 * r['error']:+.0f}% | "
                         f"{p['device'] / 2**20:.2f} / {m['peak'] / 2**20:.2f} | {p['tp'] / 1e6:.2f} / {m['tp'] / 1e6:.2f} | "
                         f"{' '.join(f'{x:.1f}' for x in r['loads'])}{nice_text(r)} |")
        lines.append("")
    with open(path_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 6))
    hi = 0
    for c in cases:
        xs = [1e3 * r["measured"]["step_s"] for r in c["rows"]]
        ys = [1e3 * r["predicted"]["step_s"] for r in c["rows"]]
        hi = max(hi, max(xs), max(ys))
        ax.scatter(xs, ys, label=f"{c['model']}, {c['ranks']} ranks", s=18)
    ax.plot([0, hi], [0, hi], "k-", lw=0.8, label="exact")
    ax.plot([0, hi], [0, 1.35 * hi], "k:", lw=0.6, label="+-35%")
    ax.plot([0, hi], [0, 0.65 * hi], "k:", lw=0.6)
    ax.set_xlabel("measured step, ms (median)")
    ax.set_ylabel("predicted step, ms")
    ax.set_title("tessera plan on this machine's ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path_png, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2", help="comma-separated: 2, 4")
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json")
    p.add_argument("--docs", action="store_true", help="write docs/plan_validation.md and .png")
    p.add_argument("--from-json", help="comma-separated --json files of earlier runs: write --docs from them, run nothing")
    args = p.parse_args()
    if args.from_json:
        runs = [json.load(open(f)) for f in args.from_json.split(",")]
        cases = [c for r in runs for c in r["cases"]]
        command = "\n    ".join(r["command"] for r in runs)
        write_docs(cases, command, runs[0]["cpu"], runs[0]["flags"], runs[0].get("started", float("nan")),
                   os.path.join(ROOT, "docs", "plan_validation.md"), os.path.join(ROOT, "docs", "plan_validation.png"))
        return
    ranks = [int(r) for r in args.ranks.split(",")]
    for r in ranks:
        if r not in COVER:
            sys.exit(f"--ranks {r}: the layout lists are for {sorted(COVER)} ranks")
    cpu_name, flags = cpu()
    started = load()
    print(f"CPU: {cpu_name} ({flags}), {os.cpu_count()} cores; load {started}; ranks {ranks}, rounds {args.rounds}")
    workdir = tempfile.mkdtemp(prefix="plan_validate_")
    global TESSERA  # a copy: rebuilding build/tessera during the run does not touch it
    shutil.copy2(TESSERA, os.path.join(workdir, "tessera"))
    TESSERA = os.path.join(workdir, "tessera")
    cases = [run_case(m, r, args, workdir) for r in ranks for m in args.models.split(",")]
    shutil.rmtree(workdir)
    command = "scripts/bench/plan_validate.py " + " ".join(sys.argv[1:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=cpu_name, flags=flags, command=command, started=started, cases=cases), f, indent=1)
    if args.docs:
        write_docs(cases, command, cpu_name, flags, started, os.path.join(ROOT, "docs", "plan_validation.md"),
                   os.path.join(ROOT, "docs", "plan_validation.png"))


if __name__ == "__main__":
    main()
