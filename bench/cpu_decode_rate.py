"""What one CPU core decodes per second of a JPEG set, whole and with the CPU path's
augmentation (RandomResizedCrop 224 + uint8 tensor), for sizing a share of each batch that
DataLoader workers could decode beside the GPU's decoder.

python bench/cpu_decode_rate.py /tmp/jpeg --images 200
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import time

from PIL import Image
from torchvision import transforms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--images", type=int, default=200)
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.root, "**", "*.jpg"), recursive=True))
    data = [open(f, "rb").read() for f in files[:args.images]]
    crop = transforms.RandomResizedCrop(224, scale=(0.35, 1.0), antialias=True)

    def rate(work) -> float:
        t = time.perf_counter()
        for d in data:
            work(Image.open(io.BytesIO(d)))
        return len(data) / (time.perf_counter() - t)

    whole = rate(lambda im: im.convert("RGB"))
    augmented = rate(lambda im: transforms.functional.pil_to_tensor(crop(im.convert("RGB"))))
    size = Image.open(io.BytesIO(data[0])).size
    print(json.dumps({"images": len(data), "size": size, "decode_img_s": round(whole),
                      "decode_crop_resize_img_s": round(augmented)}))


if __name__ == "__main__":
    main()
