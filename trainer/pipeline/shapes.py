"""The built-in `shapes` dataset: a small, learnable JPEG ImageFolder generated on first use.

Ten classes (five shapes, filled or outlined) in random colours, sizes and places; cached on disk so
later runs reuse it and the real decode/augment/worker path runs. Needs Pillow, not torch.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
from collections.abc import Callable

from PIL import Image, ImageDraw

VERSION = 1
SHAPES = ("circle", "square", "triangle", "cross", "star")
CLASSES = tuple(f"{shape}-{style}" for shape in SHAPES for style in ("filled", "outline"))
SIZE = 72
TRAIN_PER_CLASS = 200
VAL_PER_CLASS = 40


def cache_dir() -> str:
    base = os.environ.get("DDPTUI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ddptui")
    return os.path.join(base, f"shapes-v{VERSION}")


def ensure_shapes(progress: Callable[[int, int], None] | None = None) -> str:
    """Return the dataset root, generating it first if it is not cached yet.

    Generation writes into a private temporary folder and renames it into place, so concurrent
    ranks (under torchrun) or runs never see a half-written dataset.
    """
    root = cache_dir()
    if os.path.isfile(os.path.join(root, "COMPLETE")):
        return root
    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".shapes-", dir=parent)
    try:
        _generate(tmp, progress)
        open(os.path.join(tmp, "COMPLETE"), "w").close()
        try:
            os.rename(tmp, root)
        except OSError:  # another process finished first; theirs is identical
            if not os.path.isfile(os.path.join(root, "COMPLETE")):
                shutil.rmtree(root, ignore_errors=True)
                os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _generate(root: str, progress: Callable[[int, int], None] | None) -> None:
    rng = random.Random(1234)
    total = len(CLASSES) * (TRAIN_PER_CLASS + VAL_PER_CLASS)
    done = 0
    for split, count in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for label, name in enumerate(CLASSES):
            folder = os.path.join(root, split, name)
            os.makedirs(folder)
            for i in range(count):
                draw_shape(label, rng).save(os.path.join(folder, f"{i:04d}.jpg"), quality=90)
                done += 1
                if progress and (done % 200 == 0 or done == total):
                    progress(done, total)


def draw_shape(label: int, rng: random.Random) -> Image.Image:
    """One image of class `label`: the shape decides half the class, fill vs outline the other."""
    shape, filled = SHAPES[label // 2], label % 2 == 0
    bg = tuple(rng.randint(0, 110) for _ in range(3))
    fg = tuple(rng.randint(140, 255) for _ in range(3))
    img = Image.new("RGB", (SIZE, SIZE), bg)
    d = ImageDraw.Draw(img)
    r = rng.uniform(SIZE * 0.18, SIZE * 0.34)
    cx, cy = (rng.uniform(r + 2, SIZE - r - 2) for _ in range(2))
    width = max(2, int(r / 5))
    fill, outline = (fg, None) if filled else (None, fg)
    if shape == "circle":
        d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=outline, width=width)
    elif shape == "square":
        d.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=outline, width=width)
    else:
        points = _polygon(shape, cx, cy, r, rng.uniform(0, 2 * math.pi))
        if filled:
            d.polygon(points, fill=fg)
        else:
            d.line(points + points[:1], fill=fg, width=width, joint="curve")
    return img


def _polygon(shape: str, cx: float, cy: float, r: float, turn: float) -> list[tuple[float, float]]:
    if shape == "cross":
        return _cross(cx, cy, r, turn)
    radii, n = ([r], 3) if shape == "triangle" else ([r, r * 0.45], 10)
    return [
        (cx + radii[i % len(radii)] * math.cos(turn + 2 * math.pi * i / n),
         cy + radii[i % len(radii)] * math.sin(turn + 2 * math.pi * i / n))
        for i in range(n)
    ]


def _cross(cx: float, cy: float, r: float, turn: float) -> list[tuple[float, float]]:
    a = r * 0.35
    outline = [(a, r), (a, a), (r, a), (r, -a), (a, -a), (a, -r),
               (-a, -r), (-a, -a), (-r, -a), (-r, a), (-a, a), (-a, r)]
    c, s = math.cos(turn), math.sin(turn)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in outline]


if __name__ == "__main__":  # ddptui's supervisor generates the set once, before its ranks start
    ensure_shapes(lambda done, total: print(done, total, flush=True))
