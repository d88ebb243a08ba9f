#!/usr/bin/env python3
"""The SIMT stage of scripts/simt_check.sh that trains: `mpiexec -n 2 tessera train
configs/quickstart.toml` with train.device = "cuda" (the emulated device) against the CPU backend on
the same layout, step by step, and checkpoints crossing between the two devices.

  layouts: dp2, tp2 + sp, pp2 (1f1b), cp2, each f32 and bf16, 20 steps, the same binary, the same
           config: the losses of "cuda" within the tolerance of "cpu" (below).
  resume:  dp2 f32 stopped at step 10 on one device (train.exit_after_steps) and resumed on the
           other, both ways: steps 11-20 within the tolerance of the uninterrupted CPU run.

Tolerances, relative, per step. f32: 1e-4, the tolerance of the single-rank CUDA tests
(tests/app/cuda/test_cuda_training.cpp): the kernels' f32 sums run in other orders than the CPU's
(each op within its op case's 1e-5 or tighter) and AdamW's division by sqrt(v) passes a small
gradient's relative error into the update; a wrong index or a missing synchronisation is O(1).
bf16: 2e-3. Both devices round the same f32 values to bf16 with the same rule, but a GEMM's f32
sum in another order can land on the other side of a bf16 rounding boundary, an error of one bf16
unit (2^-8 relative) in that element of the next GEMM's input, where f32 would see 1e-7. Averaged
over a loss of thousands of tokens that stays well under 1e-3 over 20 steps; 2e-3 leaves a margin
of 2 and still fails an indexing or ordering bug (those move the loss by percent).

Prints one line per comparison with the largest relative difference seen; exits 1 on any failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

STEPS = 20
LAYOUTS = {
    "dp2": ["parallel.dp=2"],
    "tp2_sp": ["parallel.tp=2", "parallel.sequence_parallel=true"],
    "pp2_1f1b": ["parallel.pp=2", 'parallel.pp_schedule="1f1b"'],
    "cp2": ["parallel.cp=2"],
}
DTYPES = {"f32": ([], 1e-4), "bf16": (['train.dtype="bf16"'], 2e-3)}
# quickstart's model and data at a global batch of 8 sequences (its 32 take 16 s a step on the
# emulator, 4 s at 8): every layout still splits it (dp2: 4 per rank; pp2: micro-batches).
COMMON = [f"train.steps={STEPS}", "train.global_batch=8", "log.every=1", "train.eval_every=0",
          "data.val_examples=16", "checkpoint.every=0"]


def losses(run_dir):
    out = []
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if "loss" in rec and "step" in rec:
                out.append((rec["step"], rec["loss"]))
    return out


def train(args, run_dir, device, settings, log):
    cmd = ["mpiexec", "-n", "2", args.tessera, "train", args.config, "--run-dir", run_dir]
    for s in COMMON + settings + [f'train.device="{device}"']:
        cmd += ["--set", s]
    t0 = time.time()
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT,
                            env=dict(os.environ, OMP_NUM_THREADS="1")).returncode
    return rc, time.time() - t0


def compare(name, got, want, tol):
    """The largest relative difference, and a message when it exceeds tol or steps differ."""
    if [s for s, _ in got] != [s for s, _ in want]:
        return None, f"{name}: steps {[s for s, _ in got]} != {[s for s, _ in want]}"
    worst = 0.0
    for (s, g), (_, w) in zip(got, want):
        rel = abs(g - w) / abs(w)
        worst = max(worst, rel)
        if rel > tol:
            return worst, f"{name}: step {s}: loss {g!r} on cuda, {w!r} on cpu (relative {rel:.2e} > {tol:g})"
    return worst, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tessera", default="build-simt/tessera")
    ap.add_argument("--config", default="configs/quickstart.toml")
    ap.add_argument("--work", default="build-simt/check-logs/layouts")
    ap.add_argument("--only", help="comma-separated layouts (default: all) or 'resume'")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    failures = 0
    only = set(args.only.split(",")) if args.only else None

    for layout, lset in LAYOUTS.items():
        if only and layout not in only:
            continue
        for dtype, (dset, tol) in DTYPES.items():
            name = f"{layout} {dtype}"
            runs = {}
            for device in ("cpu", "cuda"):
                run_dir = os.path.join(args.work, f"{layout}_{dtype}_{device}")
                rc, secs = train(args, run_dir, device, lset + dset, run_dir + ".log")
                if rc != 0:
                    print(f"FAIL {name}: tessera train on {device} exited {rc} (log: {run_dir}.log)")
                    with open(run_dir + ".log", encoding="utf-8") as fh:
                        print("".join(fh.readlines()[-20:]))
                    failures += 1
                    break
                runs[device] = (losses(run_dir), secs)
            if len(runs) < 2:
                continue
            worst, err = compare(name, runs["cuda"][0], runs["cpu"][0], tol)
            if err:
                print("FAIL " + err)
                failures += 1
            else:
                print(f"ok   {name}: {STEPS} losses within {tol:g} (max relative difference {worst:.2e}; "
                      f"final loss cpu {runs['cpu'][0][-1][1]:.6f}, cuda {runs['cuda'][0][-1][1]:.6f}; "
                      f"{runs['cpu'][1]:.0f} s cpu, {runs['cuda'][1]:.0f} s cuda)")

    if not only or "resume" in only:
        base = os.path.join(args.work, "resume_cpu")
        rc, _ = train(args, base, "cpu", ["parallel.dp=2"], base + ".log")
        if rc != 0:
            print(f"FAIL resume: the uninterrupted cpu run exited {rc} (log: {base}.log)")
            return 1
        want = [x for x in losses(base) if x[0] > 10]
        for first, second in (("cuda", "cpu"), ("cpu", "cuda")):
            run_dir = os.path.join(args.work, f"resume_{first}_to_{second}")
            rc, _ = train(args, run_dir, first, ["parallel.dp=2", "train.exit_after_steps=10"], run_dir + ".1.log")
            if rc == 0:
                rc, _ = train(args, run_dir, second, ["parallel.dp=2"], run_dir + ".2.log")
            name = f"checkpoint {first} -> {second}"
            if rc != 0:
                print(f"FAIL {name}: exited {rc} (logs: {run_dir}.1.log, {run_dir}.2.log)")
                failures += 1
                continue
            with open(run_dir + ".2.log", encoding="utf-8") as fh:
                resumed = "resumed from" in fh.read()
            got = [x for x in losses(run_dir) if x[0] > 10]
            worst, err = compare(name, got, want, DTYPES["f32"][1])
            if not resumed:
                err = f"{name}: the second run did not resume (no 'resumed from' in {run_dir}.2.log)"
            if err:
                print("FAIL " + err)
                failures += 1
            else:
                print(f"ok   {name}: saved at step 10 on {first}, steps 11-{STEPS} on {second} within "
                      f"{DTYPES['f32'][1]:g} of the uninterrupted cpu run (max relative difference {worst:.2e})")
    print(f"simt_check-note: {'all' if failures == 0 else failures} layout comparisons "
          f"{'passed' if failures == 0 else 'failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
