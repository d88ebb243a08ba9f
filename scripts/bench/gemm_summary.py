#!/usr/bin/env python3
"""Summarizes gemm_bench logs into the markdown table of docs/performance.md "GEMM library choice".

Each log is one gemm_bench run; runs of the same library are combined per (layer, N, form) by the
median of their medians (the machine is shared, so one run is noisy) and the best of their bests.
Usage: scripts/bench/gemm_summary.py openblas=LOG[,LOG...] blis=LOG[,LOG...]
"""
import re
import statistics
import sys

ROW = re.compile(r"^(\S+)\s+(\d+)\s+(NT fwd|NN bwd-dx|TN bwd-dw)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
MIXED = re.compile(r"^mixed .*= ([\d.]+) ms alone, ([\d.]+) ms interleaved")


def read_runs(paths):
    """{(layer, n, form): [(median, best, cpu), ...]} and [(alone_ms, interleaved_ms), ...]."""
    rows, mixed = {}, []
    for path in paths:
        with open(path) as f:
            for line in f:
                if m := ROW.match(line):
                    key = (m[1], int(m[2]), m[3])
                    rows.setdefault(key, []).append((float(m[4]), float(m[5]), float(m[6])))
                elif m := MIXED.match(line):
                    mixed.append((float(m[1]), float(m[2])))
    return rows, mixed


def main(argv):
    libs = {}
    for arg in argv:
        name, _, paths = arg.partition("=")
        libs[name] = read_runs(paths.split(","))
    names = list(libs)
    keys = list(libs[names[0]][0])
    header = "| layer | N | form | " + " | ".join(f"{n} median | {n} best" for n in names) + " |"
    print(header)
    print("|" + "---|" * (3 + 2 * len(names)))
    totals = {n: {} for n in names}  # per N: [flops, seconds at the median rate]
    for layer, n, form in keys:
        cells = []
        for name in names:
            runs = libs[name][0].get((layer, n, form), [])
            med = statistics.median(r[0] for r in runs)
            best = max(r[1] for r in runs)
            cells.append(f"{med:.0f} | {best:.0f}")
            t = totals[name].setdefault(n, [0.0, 0.0])
            flops = FLOPS[layer] * n
            t[0] += flops
            t[1] += flops / (med * 1e9)
        print(f"| {layer} | {n} | {form} | " + " | ".join(cells) + " |")
    for n in sorted({k[1] for k in keys}):
        cells = [f"**{totals[name][n][0] / totals[name][n][1] * 1e-9:.0f}** | " for name in names]
        print(f"| all 15 | {n} | total flops / total time | " + " | ".join(cells) + " |")
    for name in names:
        mixed = libs[name][1]
        if mixed:
            pct = [100 * (b / a - 1) for a, b in mixed]
            print(f"\n{name} mixed GEMM + OpenMP loop, interleaving cost per run: "
                  + ", ".join(f"{p:+.0f}%" for p in pct))


# 2 * in * out per token for each layer (times N tokens gives one GEMM's flops).
FLOPS = {"attn.proj": 2 * 768 * 768, "attn.qkv": 2 * 768 * 2304, "mlp.fc": 2 * 768 * 3072,
         "mlp.proj": 2 * 3072 * 768, "lm_head": 2 * 768 * 50257}

if __name__ == "__main__":
    main(sys.argv[1:])
