#!/usr/bin/env python3
"""Dynamic context parallelism (parallel.cp_mode = "dynamic", docs/parallel.md) against static cp and
against dp alone, on 4 ranks (mpiexec -n 4, one OpenMP thread per rank) with variable-length batches
(data.batching = "tokens") of a long-tailed corpus: document lengths log-normal in bytes, clipped to
[64, --max-len] (varlen_bench.py's generator). The same GPT-2-style model and the same rows per step
in every layout, alternating, `--rounds` times each: dp 4, static cp 4 (ring), dynamic cp 4 (its cost
model measured at start). Reads the last metrics.jsonl record (the steps since the previous record:
the first ones warm up): real tokens/s and, for dynamic cp, the rows split / whole per step, the
planner's predicted imbalance and the measured busy-time imbalance over the cp ranks (max / mean - 1;
busy time includes the waits inside a split row's ring). Prints the load average before each run
and the medians.

The cost model's prediction beside the measurement: the dynamic run's records carry, per step, the
predicted seconds of the slowest cp rank's passes under its plans (cp_predicted_s) and under static
cp's (every row split over the 4 ranks, cp_predicted_static_s: the same batches, as the static run
reads them), from the cost model it measured (its cp_calibration.toml). Beside them: the measured
slowest rank's busy seconds per step (cp_busy_max_s, dynamic only) and the measured step seconds
(real tokens / real tokens/s: the passes plus the gradient reduction and the update, which the model
leaves out); predicted tokens/s = real tokens per step / predicted seconds. dp 4 has no prediction (no
cost model runs there).

  cmake --build build -j2 --target tessera
  scripts/bench/dynamic_cp_bench.py [--rounds 3] [--steps 6] [--docs 1500] [--layouts ...] [--json out.json]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from varlen_bench import make_corpus, train  # noqa: E402

# GPT-2 preset, 4 blocks of width 128, rows of seq_len positions, 16 rows per step (micro-batches
# of 4 rows: 1 per rank on dp 4, 4 accumulated on cp 4).
def model(seq_len, max_len):
    return ["model.preset=\"gpt2\"", "model.n_layer=4", "model.n_head=4", "model.n_embd=128",
            f"train.seq_len={seq_len}", f"model.max_seq_len={max_len}", "train.global_batch=16",
            "train.eval_every=0", "optim.warmup_steps=2", "checkpoint.at_end=false", "data.task=\"tokens\"",
            "data.tokenizer=\"byte\"", "data.batching=\"tokens\"", f"train.tokens_per_micro_batch={4 * seq_len}"]


# Dynamic cp first in each round: its records carry the round's predictions for both cp layouts.
LAYOUTS = {
    "dynamic cp4": ["parallel.dp=1", "parallel.cp=4", "parallel.cp_mode=\"dynamic\""],
    "dp4": ["parallel.dp=4"],
    "static cp4": ["parallel.dp=1", "parallel.cp=4"],
}


def run(layout, prefix, args, workdir):
    sets = model(args.seq_len, args.max_len) + LAYOUTS[layout] + [
        f"data.train=[{{path=\"{prefix}\"}}]", f"train.steps={args.steps}", f"log.every={args.steps // 2}"]
    records, before, cmd, kept = train(4, sets, workdir, keep=["cp_calibration.toml"])
    calib = kept["cp_calibration.toml"]
    r = records[-1]
    tps = r["real_tokens_per_s"]
    return dict(layout=layout, real_tokens_per_s=tps, real_tokens=r["real_tokens"],
                step_s=r["real_tokens"] / tps if tps > 0 else None, loss=r["loss"], load=before,
                rows_split=r.get("cp_rows_split"), rows_whole=r.get("cp_rows_whole"),
                predicted_imbalance=r.get("cp_predicted_imbalance"), busy_imbalance=r.get("cp_busy_imbalance"),
                predicted_s=r.get("cp_predicted_s"), predicted_static_s=r.get("cp_predicted_static_s"),
                busy_max_s=r.get("cp_busy_max_s"), calibration=calib,
                cmd=" ".join(cmd[:6] + ["<run dir>"] + cmd[8:]))


def predict(r, dyn):
    """The cost model's seconds and tokens/s for r (static or dynamic cp 4) from its round's dynamic
    run dyn (None for dp 4), set on r as `predicted` and `predicted_tokens_per_s`."""
    p = {"dynamic cp4": dyn["predicted_s"], "static cp4": dyn["predicted_static_s"]}.get(r["layout"])
    r["predicted"] = p
    r["predicted_tokens_per_s"] = r["real_tokens"] / p if p else None


def ms(x):
    return "-" if x is None else f"{1e3 * x:.0f}"


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--docs", type=int, default=1500)
    ap.add_argument("--median", type=float, default=120, help="median document length (bytes)")
    ap.add_argument("--sigma", type=float, default=1.2, help="log-normal sigma")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help="comma-separated subset of: " + ", ".join(LAYOUTS) + " (dynamic cp4 first: the predictions)")
    ap.add_argument("--json")
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    args = ap.parse_args()
    layouts = [l for l in LAYOUTS if l in args.layouts.split(",")]
    if not layouts or layouts[0] != "dynamic cp4":
        sys.exit("--layouts must include dynamic cp4 (it runs first: its records carry the predictions)")
    workdir = tempfile.mkdtemp(dir=args.workdir)
    prefix, lengths = make_corpus(workdir, args.docs, args.median, args.sigma, args.max_len, 1, min_len=64)
    q = lambda f: lengths[int(f * (len(lengths) - 1))]
    print(f"corpus: {len(lengths)} documents, lengths (bytes) min {lengths[0]} median {q(0.5)} p90 {q(0.9)} "
          f"p99 {q(0.99)} max {lengths[-1]}; seq_len {args.seq_len}: "
          f"{sum(n > args.seq_len for n in lengths)} documents are cut")
    print(f"4 ranks, {args.steps} steps, the last {args.steps // 2} measured; 16 rows x {args.seq_len} positions "
          "per step")
    print("| layout | round | real tokens/s | rows split / whole per step | predicted imbalance | "
          "busy imbalance | load before | predicted passes / measured busy max / step ms |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for i in range(args.rounds):
        for layout in layouts:
            r = run(layout, prefix, args, workdir)
            results.append(r)
            predict(r, results[i * len(layouts)])  # this round's dynamic cp 4 run
            rows = "-" if r["rows_split"] is None else f"{r['rows_split']:.1f} / {r['rows_whole']:.1f}"
            print(f"| {layout} | {i + 1} | {r['real_tokens_per_s']:.0f} | {rows} | {pct(r['predicted_imbalance'])} | "
                  f"{pct(r['busy_imbalance'])} | {r['load']} | {ms(r['predicted'])} / {ms(r['busy_max_s'])} / "
                  f"{ms(r['step_s'])} |", flush=True)
            if r["calibration"]:  # this round's cost model, one line
                print("  cost model: " + " ".join(l.split("#")[0].strip() for l in r["calibration"].splitlines()
                                                  if "=" in l), flush=True)
    print("\nThe cost model's prediction (from each round's dynamic run) beside the measurement, per step:")
    print("| layout | round | predicted passes ms | measured busy max ms | measured step ms | "
          "predicted tokens/s | measured tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for i, r in enumerate(results):
        ptps = "-" if r["predicted_tokens_per_s"] is None else f"{r['predicted_tokens_per_s']:.0f}"
        print(f"| {r['layout']} | {i // len(layouts) + 1} | {ms(r['predicted'])} | {ms(r['busy_max_s'])} | "
              f"{ms(r['step_s'])} | {ptps} | {r['real_tokens_per_s']:.0f} |")
    for layout in layouts:
        rows = [r for r in results if r["layout"] == layout]
        med = statistics.median(r["real_tokens_per_s"] for r in rows)
        pred = [r["predicted_tokens_per_s"] for r in rows if r["predicted_tokens_per_s"]]
        print(f"median {layout}: real tokens/s {med:.0f}" +
              (f", predicted {statistics.median(pred):.0f}" if pred else ""))
        print("command:", rows[0]["cmd"])
    for r in results:
        if r["calibration"]:
            print("a measured cost model (cp_calibration.toml):\n" + r["calibration"])
            break
    shutil.rmtree(workdir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
