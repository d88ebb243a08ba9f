#!/usr/bin/env python3
"""CPU seconds per training step, for comparisons on a machine whose cores other work shares.

Wall-clock steps measure the other processes as much as the binary. The CPU time a single-thread
run spends per step is steadier: this script runs each spec's TOML (train_bench.py's, random
tokens in an llm.c shard) for 2 and for 8 steps and reports (CPU of 8 - CPU of 2) / 6, so start-up
(model init, the GEMM rate check) cancels. Specs alternate within each round.

    scripts/bench/cpu_seconds_ab.py --config gpt2-6l-384 --rounds 3 build/tessera:fp32 build/tessera:bf16
    scripts/bench/cpu_seconds_ab.py --config gpt2-124m old/tessera:bf16 build/tessera:bf16

Each spec is BINARY:DTYPE (fp32 or bf16). Runs with OMP_NUM_THREADS=1 and OPENBLAS_CORETYPE unset.
Still not a clean-machine number: shared caches and memory bandwidth slow a process even on its
own core. Read the medians.
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench as tb  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="+", help="BINARY:DTYPE")
    ap.add_argument("--config", default="gpt2-6l-384", help="a train_bench.py configuration")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    configs = {c.name: c for c in tb.CONFIGS + tb.EXTRA_CONFIGS}
    if args.config not in configs:
        sys.exit(f"--config {args.config}: not one of {', '.join(configs)}")
    c = configs[args.config]
    specs = []
    for s in args.specs:
        binary, _, dtype = s.rpartition(":")
        if not binary or dtype not in ("fp32", "bf16"):
            sys.exit(f"{s}: expected BINARY:DTYPE with DTYPE fp32 or bf16")
        specs.append((s, binary, dtype))
    work = tempfile.mkdtemp(prefix="cpu_seconds_ab_")
    data = os.path.join(work, "tokens.bin")
    tb.write_llmc_shard(data, 1 << 20, c.vocab_size, seed=1234)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("OPENBLAS_CORETYPE", None)

    def cpu_seconds(binary, dtype, steps):
        toml = os.path.join(work, f"{dtype}-{steps}.toml")
        with open(toml, "w") as f:
            f.write(tb.tessera_toml(c, steps, data, 100.0, dtype))
        run_dir = os.path.join(work, "run")
        p = subprocess.Popen([binary, "train", toml, "--run-dir", run_dir], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = p.communicate()
        shutil.rmtree(run_dir, ignore_errors=True)
        if p.returncode != 0:
            sys.exit(f"{binary} train {toml} failed ({p.returncode}):\n{err.decode()[-2000:]}")

    results = {s: [] for s, _, _ in specs}
    for r in range(args.rounds):
        for s, binary, dtype in specs:
            per_run = []
            for steps in (2, 8):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu_seconds(binary, dtype, steps)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                per_run.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
            results[s].append((per_run[1] - per_run[0]) / 6)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{s} {results[s][-1]:.3f}" for s, _, _ in specs), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n{c.name}: CPU seconds per step (single thread), {args.rounds} rounds; load average {os.getloadavg()}")
    for s, _, _ in specs:
        v = results[s]
        print(f"  {s:40s} median {statistics.median(v):.3f}  runs {', '.join(f'{x:.3f}' for x in v)}")


if __name__ == "__main__":
    main()
