#!/usr/bin/env python3
"""Step time with parallel.mpi_wait = "spin" beside "yield", in one run (docs/parallel.md, "Waiting for MPI").

Trains the small GPT-2 of scripts/bench/plan_validate.py (4 layers, C = 256, 32 sequences of 64
tokens a step, fp32, micro-batch 4) under `mpiexec -n RANKS` (one OpenMP thread per rank) on
layouts that cover dp, tp + sp, pp and cp; each layout with both waits, alternating, --rounds
times; prints the median step time of each and the ratio, with the CPU and the load.

  cmake --build build -j2 --target tessera
  scripts/bench/mpi_wait_bench.py [--ranks 4] [--rounds 3] [--model gpt2]
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_validate as pv  # noqa: E402  (the model, the runner and the CPU line)

MB4 = ["train.micro_batch=4"]
LAYOUTS = {
    2: [("dp2", MB4), ("tp2", ["parallel.tp=2"] + MB4), ("pp2", ["parallel.pp=2"] + MB4),
        ("cp2", ["parallel.cp=2"] + MB4)],
    4: [("dp4", MB4), ("tp4", ["parallel.tp=4"] + MB4),
        ("dp2 tp2 sp", ["parallel.tp=2", "parallel.sequence_parallel=true"] + MB4),
        ("tp2 pp2", ["parallel.tp=2", "parallel.pp=2"] + MB4), ("pp4 1f1b", ["parallel.pp=4"] + MB4),
        ("dp2 cp2", ["parallel.cp=2"] + MB4)],
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4, choices=sorted(LAYOUTS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--model", default="gpt2", choices=sorted(pv.MODELS))
    a = p.parse_args()
    name, flags = pv.cpu()
    print(f"CPU: {name} ({flags}), {os.cpu_count()} cores; load {pv.load():.2f}; {a.ranks} ranks, "
          f"rounds {a.rounds}", flush=True)
    times = {}
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.rounds):
            for layout, keys in LAYOUTS[a.ranks]:
                for wait in ("spin", "yield"):
                    m = pv.measure(a.model, a.ranks, keys + [f'parallel.mpi_wait="{wait}"'], a.steps, work)
                    if m is None:
                        sys.exit(f"{layout} with parallel.mpi_wait = {wait} failed")
                    times.setdefault((layout, wait), []).append(m["step_s"] * 1e3)
                    print(f"round {r + 1}: {layout:12s} {wait:5s} {m['step_s'] * 1e3:8.1f} ms "
                          f"(load {pv.load():.2f})", flush=True)
    print(f"\n| layout ({a.ranks} ranks) | spin ms (median; rounds) | yield ms (median; rounds) | spin / yield |")
    print("|---|---|---|---|")
    for layout, _ in LAYOUTS[a.ranks]:
        s, y = times[(layout, "spin")], times[(layout, "yield")]
        rounds = lambda v: ", ".join(f"{x:.0f}" for x in v)  # noqa: E731
        print(f"| {layout} | {statistics.median(s):.0f} ({rounds(s)}) | {statistics.median(y):.0f} ({rounds(y)}) "
              f"| {statistics.median(s) / statistics.median(y):.2f}x |")


if __name__ == "__main__":
    main()
