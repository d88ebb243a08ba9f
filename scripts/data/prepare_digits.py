#!/usr/bin/python3
"""The handwritten digits set for a vision-language model: scikit-learn's load_digits (1,797 real
8x8 grey images of handwritten digits 0-9, shipped with scikit-learn, no download) written as PNG
files with captions "the digit 7", then `tessera prepare --images` on a training and a held-out
split (a seeded shuffle; the last --val-fraction held out).

    /usr/bin/python3 scripts/data/prepare_digits.py            # -> data/digits/{train,val}.h5
    build/tessera train configs/digits-vl.toml

Needs scikit-learn for Debian's /usr/bin/python3: `apt-get install python3-sklearn` (or
`pip install scikit-learn` for another Python). The PNGs are written with zlib alone (no PIL).
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load_digits():
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError:
        sys.exit("prepare_digits.py needs scikit-learn, which ships the digits set: "
                 "apt-get install python3-sklearn (Debian's /usr/bin/python3), or pip install scikit-learn")
    d = sk_load_digits()
    return d.images, d.target  # (1797, 8, 8) floats 0..16, (1797,) ints


def write_grey_png(path, rows):
    """rows: lists of 0..255 ints, one list per row; an 8-bit greyscale PNG."""
    h, w = len(rows), len(rows[0])

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(r) for r in rows)  # filter type 0 per row
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "data", "digits"), help="output directory (default data/digits)")
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build", "tessera"), help="the tessera binary")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "digits-vl.toml"),
                    help="the config whose [vision] image_size and patch_size the files are made for")
    ap.add_argument("--val-fraction", type=float, default=0.2, help="held-out fraction (default 0.2)")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N images (0 = all 1,797)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split's shuffle")
    args = ap.parse_args()
    if not 0 < args.val_fraction < 1:
        sys.exit("--val-fraction must be in (0, 1)")

    images, targets = load_digits()
    n = len(images) if args.limit <= 0 else min(args.limit, len(images))
    img_dir = os.path.join(args.out, "images")
    os.makedirs(img_dir, exist_ok=True)
    order = list(range(n))
    random.Random(args.seed).shuffle(order)
    n_val = max(1, int(round(n * args.val_fraction)))
    splits = {"train": order[: n - n_val], "val": order[n - n_val:]}
    for i in range(n):
        # 0..16 ink levels to 0..255 (bright ink on black, as scikit-learn stores them).
        rows = [[int(round(v * 255 / 16)) for v in row] for row in images[i]]
        write_grey_png(os.path.join(img_dir, "digit_%04d.png" % i), rows)
    for split, idx in splits.items():
        with open(os.path.join(args.out, split + ".jsonl"), "w") as f:
            for i in idx:
                f.write(json.dumps({"image": "digit_%04d.png" % i, "text": "the digit %d" % targets[i]}) + "\n")
    print("wrote %d PNGs to %s (%d train, %d held out)" % (n, img_dir, len(splits["train"]), len(splits["val"])))
    for split in splits:
        cmd = [args.tessera, "prepare", "--images", img_dir, "--captions", os.path.join(args.out, split + ".jsonl"),
               "--out", os.path.join(args.out, split + ".h5"), "--tokenizer", "byte", "--config", args.config]
        print("+ " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd)
        if r.returncode != 0:
            sys.exit(r.returncode)


if __name__ == "__main__":
    main()
