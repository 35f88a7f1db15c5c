"""A JPEG ImageFolder like a photo dataset's (500x375, textured, ~100 KB decoded work each), for
input-pipeline benchmarks: python bench/make_jpegs.py DIR --classes 10 --per-class 2000
"""

from __future__ import annotations

import argparse
import os
from multiprocessing import Pool

import numpy as np
from PIL import Image


def write(job: tuple[str, int, int]) -> None:
    path, label, seed = job
    rng = np.random.default_rng(seed)
    # Smooth colour fields plus noise: compresses like a photo, not like a flat test card.
    small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((500, 375), Image.BICUBIC)
    arr = np.asarray(img, dtype=np.int16) + rng.integers(-20, 21, (375, 500, 3))
    arr[..., label % 3] = np.clip(arr[..., label % 3] + 40, 0, 255)
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(path, quality=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=2000)
    parser.add_argument("--val-per-class", type=int, default=50)
    args = parser.parse_args()
    jobs = []
    for split, n in (("train", args.per_class), ("val", args.val_per_class)):
        for c in range(args.classes):
            folder = os.path.join(args.root, split, f"class{c:02d}")
            os.makedirs(folder, exist_ok=True)
            jobs += [(os.path.join(folder, f"{i:05d}.jpg"), c, (split == "val") * 10**8 + c * 10**6 + i)
                     for i in range(n)]
    with Pool() as pool:
        pool.map(write, jobs, chunksize=64)
    print(f"{len(jobs)} JPEGs under {args.root}")


if __name__ == "__main__":
    main()
