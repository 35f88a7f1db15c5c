"""--decode gpu: DataLoader workers only read JPEG bytes and draw each sample's crop; the rank
decodes the batch on the device (torchvision's nvJPEG, or nvImageCodec: nvdecode.py) and crops,
resizes, flips and normalises there. Same augmentation as the CPU path.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable

import torch
from PIL import Image, JpegImagePlugin, UnidentifiedImageError
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.ops import roi_align

from trainer.pipeline import nvdecode
from trainer.pipeline.badsamples import BadSample, first_readable
from trainer.pipeline.decoders import nvimgcodec_installed
from trainer.pipeline.nvjpeg import HardwareJpeg
from trainer.pipeline.prefetch import Normalize
from trainer.pipeline.resize import crop_resize
from trainer.pipeline.sampler import seed_sample

SCALE, RATIO = (0.35, 1.0), (3 / 4, 4 / 3)  # as the CPU path's RandomResizedCrop


class JpegFiles(Dataset):
    """(bytes, box, label, path) per (epoch, index) key. box: the crop [top, left, height,
    width], the flip coin, the image's [height, width], and whether the GPU's JPEG engines can
    decode it; the path names a sample that the rank's codec cannot decode."""

    def __init__(self, samples: list[tuple[str, int]], size: int, train: bool,
                 seed: int | None = None):
        self.samples, self.size, self.train, self.seed = samples, size, train, seed
        self.notes: str | None = None  # where skipped samples are noted (None: fail at one)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key):
        epoch, index = key if isinstance(key, tuple) else (0, key)
        index, data, height, width, engines = first_readable(
            self._read, index, len(self.samples), epoch, lambda i: self.samples[i][0], self.notes)
        label = self.samples[index][1]
        if self.seed is not None:
            seed_sample(self.seed, epoch, index)
        box = self._train_box(height, width) if self.train else self._val_box(height, width)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), \
            torch.tensor(box + [height, width, engines]), label, self.samples[index][0]

    def _read(self, index: int) -> tuple[int, bytes, int, int, int]:
        path = self.samples[index][0]
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise BadSample(e.strerror or str(e)) from None
        if data[:2] != b"\xff\xd8":
            raise BadSample("not a JPEG file (--decode gpu reads JPEG files only)")
        try:  # the header of the bytes already read: no second open, no pixels decoded
            with Image.open(io.BytesIO(data), formats=["JPEG"]) as im:
                width, height = im.size
                engines = int(engines_can_decode(im))
        except OSError as e:
            raise BadSample("cannot identify image file" if isinstance(e, UnidentifiedImageError)
                            else str(e)) from None
        return index, data, height, width, engines

    def _train_box(self, height: int, width: int) -> list[int]:
        """RandomResizedCrop's parameters, and a coin for the horizontal flip."""
        area = height * width
        flip = int(torch.rand(1) < 0.5)
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*SCALE).item()
            log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
            aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, (1,)))
                left = int(torch.randint(0, width - w + 1, (1,)))
                return [top, left, h, w, flip]
        side = min(height, width)  # fallback: the central square
        return [(height - side) // 2, (width - side) // 2, side, side, flip]

    def _val_box(self, height: int, width: int) -> list[int]:
        """Resize(size * 8/7) then CenterCrop(size), as one crop of the original."""
        side = max(1, round(min(height, width) * 7 / 8))
        return [(height - side) // 2, (width - side) // 2, side, side, 0]


def engines_can_decode(im: Image.Image) -> bool:
    """What nvJPEG's hardware decoder takes: one scan (not progressive), grey or YCbCr with
    4:4:4, 4:2:2 or 4:2:0 chroma (not CMYK, not 4:1:1)."""
    if "progressive" in im.info or "progression" in im.info:
        return False
    return im.mode == "L" or (im.mode == "RGB" and JpegImagePlugin.get_sampling(im) in (0, 1, 2))


def collate(batch: list) -> tuple:
    """One flat byte tensor plus lengths: pinning a batch is then one copy, not one pinned
    allocation per image (measured: that capped the loader near 8k img/s on two H200s). The
    last item holds images the workers decoded (workerdecode.py): none here."""
    data, boxes, labels, paths = zip(*batch, strict=True)
    return (torch.cat(data), torch.tensor([len(d) for d in data]), torch.stack(boxes),
            torch.tensor(labels), paths, None)


class Decoder:
    """A loader batch -> (normalised images, labels) on the device. The codec decodes whole
    images (CHW) or only each sample's crop (HWC); either way every image is cropped, resized
    and flipped in a few batched kernels (a loop of small per-image kernels kept the rank's
    thread busier than the GPU: measured 7k img/s). Images the workers finished follow."""

    def __init__(self, device: torch.device, size: int, normalize: Normalize, codec,
                 undecodable: Callable[[str], None]):
        self.device, self.size, self.normalize, self.codec = device, size, normalize, codec
        self.undecodable = undecodable  # called with the path of each sample the codec failed

    def __call__(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        flat, lengths, boxes, labels, paths, done = batch
        parts = [self._decode(flat, lengths, boxes, paths)] if len(lengths) else []
        if done is not None:
            parts.append(done.to(self.device, non_blocking=done.is_pinned()).float())
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        labels = labels.to(self.device, non_blocking=True)
        return self.normalize.standardize(out), labels

    def _decode(self, flat: torch.Tensor, lengths: torch.Tensor, boxes: torch.Tensor,
                paths: tuple[str, ...]) -> torch.Tensor:
        images = self.codec.decode(flat, lengths, boxes)
        for i, image in enumerate(images):
            if image is None:  # bytes the worker's header check passed: noted, then black
                self.undecodable(paths[i])
                top, left, height, width = boxes[i, :4].tolist()
                shape = (height, width, 3) if self.codec.crops else (3, top + height, left + width)
                images[i] = torch.zeros(shape, dtype=torch.uint8, device=self.device)
        return self._resize_crops(images, boxes) if self.codec.crops else \
            self._crop_and_resize(images, boxes)

    def _crop_and_resize(self, images: list[torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
        """Whole images: one roi_align call per image size, then the flips (measured 6-9% faster
        than crop_resize's canvas for a set of one size: no per-image copies)."""
        out = torch.empty(len(images), 3, self.size, self.size, device=self.device)
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i, image in enumerate(images):
            by_shape.setdefault(tuple(image.shape[1:]), []).append(i)
        rois = boxes.to(torch.float32)
        for index in by_shape.values():
            stack = torch.stack([images[i] for i in index]).float()
            top, left, h, w = rois[index, 0], rois[index, 1], rois[index, 2], rois[index, 3]
            regions = torch.stack([torch.arange(len(index), dtype=torch.float32), left, top,
                                   left + w, top + h], 1).to(self.device, non_blocking=True)
            # sampling_ratio -1: as many samples per output pixel as the crop is larger, an
            # average like antialiased resizing.
            out[index] = roi_align(stack, regions, (self.size, self.size), aligned=True,
                                   sampling_ratio=-1)
        flipped = boxes[:, 4].nonzero().squeeze(1)  # only these are read and written again
        if len(flipped):
            flipped = flipped.to(self.device, non_blocking=True)
            out[flipped] = out[flipped].flip(-1)
        return out

    def _resize_crops(self, images: list[torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
        """Crops of every size: on a canvas as large as the largest, resized by crop_resize
        (roi_align would read past a crop's edge into the canvas)."""
        height = max(image.shape[0] for image in images)
        width = max(image.shape[1] for image in images)
        canvas = torch.empty(len(images), height, width, 3, dtype=torch.uint8, device=self.device)
        # One call whatever the batch size, instead of a Python loop of copy_ under the GIL.
        torch._foreach_copy_([canvas[i, :image.shape[0], :image.shape[1]]
                              for i, image in enumerate(images)], images)
        shapes = torch.tensor([image.shape[:2] for image in images], dtype=torch.float32)
        crops = torch.cat([torch.zeros_like(shapes), shapes], 1).to(self.device, non_blocking=True)
        flip = boxes[:, 4].bool().to(self.device, non_blocking=True)
        dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        return crop_resize(canvas, crops, flip, self.size, dtype).float()


class TorchvisionCodec:
    """nvJPEG through torchvision.io.decode_jpeg: whole images, decoded on the SMs."""

    crops = False

    def __init__(self, device: torch.device):
        self.device = device
        self.name = f"torchvision {'nvJPEG' if device.type == 'cuda' else 'libjpeg'} (whole images)"

    def decode(self, flat: torch.Tensor, lengths: torch.Tensor,
               boxes: torch.Tensor) -> list[torch.Tensor]:
        data = list(torch.split(flat, lengths.tolist()))
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)


def choose_codec(device: torch.device):
    """torchvision's nvJPEG; nvJPEG's hardware decoder called directly with
    DDPTUI_DECODER=engines; nvImageCodec with DDPTUI_DECODER=nvimgcodec where it is installed.
    Neither trained faster than torchvision's path on one H200 (docs/benchmarks.md), so neither
    is the default. A fallback says why in its name, which the rank announces."""
    chosen = os.environ.get("DDPTUI_DECODER")
    if chosen == "engines":
        if device.type != "cuda":
            why = "DDPTUI_DECODER=engines needs a GPU"
        else:
            try:
                return HardwareJpeg(device, TorchvisionCodec(device), lanes=2)
            except RuntimeError as e:  # no engines on this GPU, or no libnvjpeg
                why = f"DDPTUI_DECODER=engines: {e}"
        codec = TorchvisionCodec(device)
        codec.name += f"; {why}"
        return codec
    if chosen != "nvimgcodec":
        return TorchvisionCodec(device)
    if not nvimgcodec_installed():  # validated by ddptui run; a torchrun node may differ
        why = "DDPTUI_DECODER=nvimgcodec but it is not installed: pip install 'ddptui[nvimgcodec]'"
    else:
        try:
            return nvdecode.NvImageCodec(device, os.environ.get("DDPTUI_NVIMGCODEC", ""))
        except RuntimeError as e:  # installed but unusable here (driver, CUDA version)
            why = f"nvImageCodec failed: {str(e).splitlines()[0]}"
    codec = TorchvisionCodec(device)
    codec.name += f"; {why}"
    return codec
