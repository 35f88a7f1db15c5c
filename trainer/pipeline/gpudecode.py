"""--decode gpu: DataLoader workers only read JPEG bytes and draw each sample's crop; the rank
decodes the batch on the device (torchvision's nvJPEG) and crops, resizes, flips and normalises
there. Same augmentation as the CPU path.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.ops import roi_align

from ddptui.rank.prefetch import Normalize
from ddptui.rank.sampler import seed_sample
from ddptui_trainer.pipeline.badsamples import BadSample, first_readable

SCALE, RATIO = (0.35, 1.0), (3 / 4, 4 / 3)  # as the CPU path's RandomResizedCrop


class JpegFiles(Dataset):
    """(bytes, box, label, path) per (epoch, index) key. box: the crop [top, left, height,
    width] and the flip coin; the path names a sample that the rank's codec cannot decode."""

    def __init__(self, samples: list[tuple[str, int]], size: int, train: bool,
                 seed: int | None = None):
        self.samples, self.size, self.train, self.seed = samples, size, train, seed
        self.notes: str | None = None  # where skipped samples are noted (None: fail at one)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key):
        epoch, index = key if isinstance(key, tuple) else (0, key)
        index, data, height, width = first_readable(
            self._read, index, len(self.samples), epoch, lambda i: self.samples[i][0], self.notes)
        label = self.samples[index][1]
        if self.seed is not None:
            seed_sample(self.seed, epoch, index)
        box = self._train_box(height, width) if self.train else self._val_box(height, width)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), torch.tensor(box), label, \
            self.samples[index][0]

    def _read(self, index: int) -> tuple[int, bytes, int, int]:
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
        except OSError as e:
            raise BadSample("cannot identify image file" if isinstance(e, UnidentifiedImageError)
                            else str(e)) from None
        return index, data, height, width

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


def collate(batch: list) -> tuple:
    """One flat byte tensor plus lengths: pinning a batch is then one copy, not one pinned
    allocation per image, which capped the loader (docs/benchmarks.md, the input pipeline)."""
    data, boxes, labels, paths = zip(*batch, strict=True)
    return (torch.cat(data), torch.tensor([len(d) for d in data]), torch.stack(boxes),
            torch.tensor(labels), paths)


# Images resized at a time: their float copy (whole decoded images) is the largest buffer of the
# decode stream, 0.58 GB for a batch of 256 500x375 images; 32 at a time took resnet18's GPU
# memory from 1.23x to 1.11x that of synthetic data at the same speed (docs/benchmarks.md).
CHUNK = 32


class Decoder:
    """A loader batch -> (normalised images, labels) on the device. The codec decodes whole
    images (CHW); they are cropped, resized and flipped in a few batched kernels (a loop of
    small per-image kernels kept the rank's thread busier than the GPU)."""

    def __init__(self, device: torch.device, size: int, normalize: Normalize, codec,
                 undecodable: Callable[[str], None]):
        self.device, self.size, self.normalize, self.codec = device, size, normalize, codec
        self.undecodable = undecodable  # called with the path of each sample the codec failed

    def __call__(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        flat, lengths, boxes, labels, paths = batch
        images = self._decode(flat, lengths, boxes, paths)
        labels = labels.to(self.device, non_blocking=True)
        return self._crop_and_resize(images, boxes), labels

    def _decode(self, flat: torch.Tensor, lengths: torch.Tensor, boxes: torch.Tensor,
                paths: tuple[str, ...]) -> list[torch.Tensor]:
        images = self.codec.decode(flat, lengths, boxes)
        for i, image in enumerate(images):
            if image is None:  # bytes the worker's header check passed: noted, then black
                self.undecodable(paths[i])
                top, left, height, width = boxes[i, :4].tolist()
                images[i] = torch.zeros((3, top + height, left + width), dtype=torch.uint8,
                                        device=self.device)
        return images

    def _crop_and_resize(self, images: list[torch.Tensor | None],
                         boxes: torch.Tensor) -> torch.Tensor:
        """The standardised batch, made per image size CHUNK images at a time (a canvas of
        every crop was 6-9% slower), each chunk standardised into its places."""
        norm = self.normalize
        out = torch.empty((len(images), 3, self.size, self.size), dtype=norm.dtype,
                          device=self.device).contiguous(memory_format=norm.memory_format)
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i, image in enumerate(images):
            by_shape.setdefault(tuple(image.shape[1:]), []).append(i)
        chunks = [group[start:start + CHUNK] for group in by_shape.values()
                  for start in range(0, len(group), CHUNK)]
        table = self._table(chunks, boxes)
        start = 0
        for index in chunks:
            rows, start = table[start:start + len(index)], start + len(index)
            resized = self._resize(images, index, rows)
            if len(index) == len(images):  # one size, one chunk: straight into the batch
                norm.standardize(resized, out=out)
            else:
                out[rows[:, 6].long()] = norm.standardize(resized)
        return out

    def _table(self, chunks: list[list[int]], boxes: torch.Tensor) -> torch.Tensor:
        """Per image, chunk by chunk: its place in its chunk, its crop (left, top, right,
        bottom), whether it is flipped, its place in the batch; on the device in one copy from
        pinned memory. A copy from pageable memory first waits for the stream's queued kernels:
        one per chunk held the decoding thread to the pace of the GPU it shares with training."""
        order = [i for index in chunks for i in index]
        top, left, height, width, flip = boxes[order].to(torch.float32).unbind(1)
        place = torch.cat([torch.arange(len(index), dtype=torch.float32) for index in chunks])
        table = torch.stack([place, left, top, left + width, top + height, flip,
                             torch.tensor(order, dtype=torch.float32)], 1)
        if self.device.type == "cuda":
            table = table.pin_memory()
        return table.to(self.device, non_blocking=True)

    def _resize(self, images: list[torch.Tensor | None], index: list[int],
                rows: torch.Tensor) -> torch.Tensor:
        """Images `index` (of one size) cropped to their boxes, resized and flipped, in float;
        each decoded image is let go once its float copy exists. `rows`: their _table rows."""
        stack = torch.empty((len(index), *images[index[0]].shape), device=self.device)
        torch.stack([images[i] for i in index], out=stack)  # uint8 to float in one pass
        for i in index:
            images[i] = None
        # sampling_ratio -1: as many samples per output pixel as the crop is larger, an average
        # like antialiased resizing.
        resized = roi_align(stack, rows[:, :5], (self.size, self.size), aligned=True,
                            sampling_ratio=-1)
        del stack
        # Chosen on the device from the table: indexing the flipped ones took a copy of their
        # indices of its own.
        return torch.where(rows[:, 5].view(-1, 1, 1, 1) > 0, resized.flip(-1), resized)


class TorchvisionCodec:
    """nvJPEG through torchvision.io.decode_jpeg: whole images, baseline JPEGs on the GPU's JPEG
    engines where it has them (A100, H100, H200), the others on the SMs. The one codec:
    nvJPEG's hardware decoder called directly, nvImageCodec and a share decoded by the
    DataLoader workers trained no faster on one H200 or two (docs/input-pipeline.md).

    torchvision allocates the images on the caller's current stream but writes them on a
    stream of its own that waits for nothing: memory the caller's stream freed a moment ago,
    still read by its queued kernels (the last batch's crop indices, say), was overwritten
    under them (device asserts and illegal addresses in resnet18 with --decode gpu). So the
    images are allocated under `self.alloc`, a stream nothing else runs on, whose blocks come
    back only once every stream that used them is done; the caller's stream waits for them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.name = f"torchvision {'nvJPEG' if device.type == 'cuda' else 'libjpeg'} (whole images)"
        self.alloc = torch.cuda.Stream(device) if device.type == "cuda" else None

    def decode(self, flat: torch.Tensor, lengths: torch.Tensor,
               boxes: torch.Tensor) -> list[torch.Tensor | None]:
        """None for an image the codec cannot decode."""
        data = list(torch.split(flat, lengths.tolist()))
        if self.alloc is None:
            return self._decode(data)
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.alloc):
            images = self._decode(data)  # torchvision makes `alloc` wait for its own stream
        consumer.wait_stream(self.alloc)
        for image in images:
            if image is not None:
                image.record_stream(consumer)  # freed: reused only once `consumer` is past it
        return images

    def _decode(self, data: list[torch.Tensor]) -> list[torch.Tensor | None]:
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:  # one broken file fails the whole batch: decode it image by image
            return [self._one(d) for d in data]

    def _one(self, data: torch.Tensor) -> torch.Tensor | None:
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return None
