#!/usr/bin/python3
"""Draws a simulated pipeline schedule: one row per rank, forward / backward / weight-gradient boxes
labelled with their micro-batch, idle time left blank (docs/parallel.md, "Pipeline schedules").

Usage:
  build/bench/pipeline_sim --pp 4 --micro-batches 8 --schedule 1f1b --json 1f1b.json
  scripts/pipeline_timeline.py 1f1b.json [more.json ...] [--out-dir docs/images]
Writes <name>.png beside each JSON file, or into --out-dir. Needs matplotlib (Debian:
python3-matplotlib, run with /usr/bin/python3).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLORS = {"F": "#3b73b9", "R": "#8e5bb5", "B": "#e8862a", "W": "#4a9c5d"}
NAMES = {"F": "forward", "R": "recomputed forward (R)", "B": "backward", "W": "weight gradient (W)"}


def shade(color, chunk, vpp):
    """Chunk 0 in the full colour, later chunks lighter."""
    if vpp <= 1:
        return color
    t = 0.55 * chunk / (vpp - 1)
    return tuple(c + (1 - c) * t for c in to_rgb(color))


def held(d):
    """Bubble recomputation: the most recomputed micro-batches a rank holds at once (the K used)."""
    if d.get("recompute") != "bubble":
        return ""
    return f" (at most {max(r.get('peak_recomputed', 1) for r in d['ranks'])} held)"


def formula(d):
    """The bubble the docs give for this schedule (fraction of the step), or None."""
    p, m, v = d["pp"], d["micro_batches"], d["vpp"]
    c = d["costs"]
    f, b, w = c["forward"], c["backward"], c["weight"]
    work = m * (f + b + w)
    if d.get("recompute", "none") != "none":
        return None  # the formulas are those without recomputation
    if d["schedule"] in ("gpipe", "1f1b"):
        idle = (p - 1) * (f + b + w)
    elif d["schedule"] == "interleaved":
        idle = (p - 1) * (f + b + w) / v
    elif d["schedule"] == "zb-h1":
        idle = (p - 1) * (f + b - w)
    else:
        return None
    return idle / (work + idle)


def draw(d, out):
    pp = d["pp"]
    vpp = d["vpp"]
    if d["deadlock"]:
        sys.exit(f"{d['schedule']}: the simulation deadlocked; nothing to draw")
    width = max(6.0, min(16.0, d["makespan"] * 0.3))
    fig, ax = plt.subplots(figsize=(width, 0.55 * pp + 1.3))
    for s in d["spans"]:
        y = pp - 1 - s["rank"]
        dur = s["end"] - s["start"]
        ax.broken_barh([(s["start"], dur)], (y + 0.08, 0.84), facecolors=shade(COLORS[s["kind"]], s["chunk"], vpp),
                       edgecolor="white", linewidth=0.6)
        if dur >= 0.35:
            ax.text(s["start"] + dur / 2, y + 0.5, str(s["micro_batch"]), ha="center", va="center",
                    fontsize=7 if dur >= 0.6 else 5.5, color="white" if s["chunk"] == 0 else "black")
    ax.set_yticks([pp - 1 - r + 0.5 for r in range(pp)])
    ax.set_yticklabels([f"rank {r}" for r in range(pp)])
    ax.set_ylim(0, pp)
    ax.set_xlim(0, d["makespan"])
    c = d["costs"]
    kinds = sorted({s["kind"] for s in d["spans"]}, key="FRBW".index)
    if "W" in kinds:
        costs = f"B = {c['backward']:g}, W = {c['weight']:g}"
    else:
        costs = f"backward (B + W) = {c['backward'] + c['weight']:g}"
    ax.set_xlabel(f"time (one stage, one micro-batch: forward = {c['forward']:g}, {costs}"
                  + (f"; a chunk takes 1/{vpp} of it" if vpp > 1 else "")
                  + ("; a backward without its R re-runs the forward inside" if d.get("recompute", "none") != "none"
                     else "") + ")")
    expected = formula(d)
    recompute = d.get("recompute", "none")
    title = (f"{d['schedule']}: pp = {pp}" + (f", vpp = {vpp}" if vpp > 1 else "") + f", {d['micro_batches']} "
             f"micro-batches" + (f", recompute {recompute}" if recompute != "none" else "")
             + held(d) + (f", latency {c['latency']:g}" if c.get("latency", 0) > 0 else "")
             + f"; bubble {100 * d['bubble_fraction']:.1f}%")
    if expected is not None:
        title += f" (formula {100 * expected:.1f}%)"
    ax.set_title(title, fontsize=10)
    handles = [Patch(color=COLORS[k], label=NAMES[k] if k != "B" or "W" not in kinds else "input gradient (B)")
               for k in kinds]
    if vpp > 1:
        later = "chunk 1" if vpp == 2 else f"chunks 1-{vpp - 1}"
        handles.append(Patch(color=shade("#888888", vpp - 1, vpp), label=f"lighter: {later}"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(handles), fontsize=8,
              frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="timelines written by build/bench/pipeline_sim --json")
    ap.add_argument("--out-dir", help="where the PNGs go (default: beside each JSON file)")
    args = ap.parse_args()
    for path in args.json:
        with open(path) as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}: not JSON ({e})")
        stem = os.path.splitext(os.path.basename(path))[0]
        out = os.path.join(args.out_dir or os.path.dirname(path) or ".", stem + ".png")
        draw(d, out)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
