#!/usr/bin/python3
"""A grid of held-out images with a vision-language checkpoint's greedy captions under them (green
when the caption is the image's own, red with the right one in brackets when not).

    /usr/bin/python3 scripts/plot_vl_captions.py --checkpoint runs/quickstart-vl/checkpoints/step_00004000.h5 \\
        --n 12 --out docs/vl_captions.png

It runs `tessera generate --checkpoint C --held-out N --dump F` (the first N held-out image
samples: --data FILE.h5, else the checkpoint's own held-out data, i.e. the scenes task's validation
scenes or the run's data.valid), which captions them and writes the images it captioned to F, and
draws them with matplotlib. Needs numpy, h5py and matplotlib (Debian: python3-numpy python3-h5py
python3-matplotlib).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a vision-language checkpoint (.h5)")
    ap.add_argument("--data", default="", help="an image-text file to caption (default: the checkpoint's held-out data)")
    ap.add_argument("--n", type=int, default=12, help="images to caption and draw (default 12)")
    ap.add_argument("--cols", type=int, default=6, help="images per row (default 6)")
    ap.add_argument("--out", required=True, help="the PNG written")
    ap.add_argument("--title", default="", help="a title above the grid (the accuracy is appended)")
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build", "tessera"), help="the tessera binary")
    args = ap.parse_args()
    try:
        import h5py
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit("plot_vl_captions.py needs h5py and matplotlib (apt-get install python3-h5py python3-matplotlib): %s" % e)

    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "captioned.h5")
        cmd = [args.tessera, "generate", "--checkpoint", args.checkpoint, "--held-out", str(args.n), "--dump", dump]
        if args.data:
            cmd += ["--data", args.data]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("%s failed:\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
        rows, accuracy = [], ""
        for line in r.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 4 and parts[0].isdigit():
                rows.append((parts[1] == "right", parts[2], parts[3]))
            elif line.startswith("caption accuracy"):
                accuracy = line
        with h5py.File(dump, "r") as f:
            images = f["images"][:]  # (N, H, W, 3) uint8
    if len(rows) != len(images) or not rows:
        sys.exit("expected one caption per image, got %d captions for %d images:\n%s" % (len(rows), len(images), r.stdout))

    n, cols = len(rows), min(args.cols, len(rows))
    nrows = (n + cols - 1) // cols
    # Each cell: the image (about 1.55 in) and up to six lines of caption under it (about 0.85 in).
    height = 2.45 * nrows + 0.3
    fig, axes = plt.subplots(nrows, cols, figsize=(1.8 * cols, height), squeeze=False)
    fig.subplots_adjust(left=0.02, right=0.98, top=1 - 0.3 / height, bottom=0.85 / height, wspace=0.12, hspace=0.62)
    for ax in axes.flat:
        ax.axis("off")
    for i, (right, got, want) in enumerate(rows):
        ax = axes.flat[i]
        ax.imshow(images[i], interpolation="nearest")
        text = "\n".join(textwrap.wrap(got or "(nothing)", 22))
        if not right:
            text += "\n[" + "\n".join(textwrap.wrap(want, 22)) + "]"
        ax.text(0.5, -0.04, text, transform=ax.transAxes, ha="center", va="top", fontsize=7.5,
                color="#1a7f37" if right else "#cf222e")
    right_count = sum(1 for r_ in rows if r_[0])
    head = (args.title + ": " if args.title else "") + "%d/%d captions right" % (right_count, n)
    fig.suptitle(head, fontsize=9, y=1 - 0.06 / height)
    fig.savefig(args.out, dpi=80)
    print(accuracy)
    print("wrote %s (%d bytes)" % (args.out, os.path.getsize(args.out)))


if __name__ == "__main__":
    main()
