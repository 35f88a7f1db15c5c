"""What one CPU core decodes per second of a JPEG set, whole and with the CPU path's
augmentation (RandomResizedCrop 224 + uint8 tensor), and as --cpu-decode-share's workers do it
(libjpeg-turbo through torchvision, torch's antialiased resize): for sizing that share.

PYTHONPATH=. python bench/cpu_decode_rate.py /tmp/jpeg --images 200
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import time

import torch
from PIL import Image
from torchvision import transforms

from trainer.pipeline.workerdecode import decode_crop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--images", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker
    files = sorted(glob.glob(os.path.join(args.root, "**", "*.jpg"), recursive=True))
    data = [open(f, "rb").read() for f in files[:args.images]]
    crop = transforms.RandomResizedCrop(224, scale=(0.35, 1.0), antialias=True)

    def rate(work, inputs) -> float:
        t = time.perf_counter()
        for x in inputs:
            work(x)
        return len(inputs) / (time.perf_counter() - t)

    def pil(d: bytes) -> Image.Image:
        return Image.open(io.BytesIO(d)).convert("RGB")

    whole = rate(pil, data)
    augmented = rate(lambda d: transforms.functional.pil_to_tensor(crop(pil(d))), data)
    size = Image.open(io.BytesIO(data[0])).size
    box = [size[1] // 8, size[0] // 8, size[1] * 3 // 4, size[0] * 3 // 4, 1]  # a typical crop
    raw = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
    workers = rate(lambda t: decode_crop(t, box, 224), raw)
    print(json.dumps({"images": len(data), "size": size, "decode_img_s": round(whole),
                      "decode_crop_resize_img_s": round(augmented),
                      "cpu_decode_share_worker_img_s": round(workers)}))


if __name__ == "__main__":
    main()
