"""--decode gpu's CPU share: the DataLoader workers decode part of each batch themselves
(libjpeg-turbo, the sample's crop, antialiased resize, flip), so fewer images wait for the GPU.

Beside a training step the GPU's decoder gets a fraction of its rate alone (docs/benchmarks.md:
20k img/s alone, 9.7k beside resnet18 on one H200); images the workers finish cost the rank
only a copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.io import ImageReadMode, decode_jpeg

from trainer.pipeline.gpudecode import collate


class SplitCollate:
    """Collates a batch of JpegFiles samples for the rank's Decoder, the last `share` of them
    decoded here. An image the worker cannot decode goes to the rank with the rest, whose
    codec notes it as it does any."""

    def __init__(self, share: float, size: int):
        self.share, self.size = share, size

    def __call__(self, batch: list) -> tuple:
        keep = len(batch) - round(self.share * len(batch))
        rest, done = list(batch[:keep]), []
        for sample in batch[keep:]:
            image = decode_crop(sample[0], sample[1].tolist(), self.size)
            if image is None:
                rest.append(sample)
            else:
                done.append((image, sample[2]))
        if not done:
            return collate(rest)
        flat, lengths, boxes, labels, paths, _ = collate(rest) if rest else _empty()
        # Straight into shared memory: the queue to the rank would copy it there otherwise.
        images = torch.empty(len(done), 3, self.size, self.size, dtype=torch.uint8).share_memory_()
        torch.stack([image for image, _ in done], out=images)
        labels = torch.cat([labels, torch.tensor([label for _, label in done])])
        return flat, lengths, boxes, labels, paths, images


def decode_crop(data: torch.Tensor, box: list[int], size: int) -> torch.Tensor | None:
    """One JPEG's crop box [top, left, height, width, flip, ...] as uint8 (3, size, size), or
    None where libjpeg cannot decode the bytes."""
    try:
        image = decode_jpeg(data, mode=ImageReadMode.RGB)
    except RuntimeError:
        return None
    top, left, height, width, flip = box[:5]
    crop = image[None, :, top:top + height, left:left + width]
    out = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True,
                        align_corners=False)[0]
    return out.flip(-1) if flip else out


def _empty() -> tuple:
    none = torch.empty(0, dtype=torch.int64)
    return torch.empty(0, dtype=torch.uint8), none, torch.empty(0, 8, dtype=torch.int64), none, \
        (), None
