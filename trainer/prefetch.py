"""Moving batches to the device: the CUDA side-stream prefetcher and the plain path.

Both turn uint8 image batches into normalised float tensors on the device, so CPU workers never
do float maths; the prefetcher overlaps the copy and normalisation of batch k+1 with step k.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Normalize:
    """uint8 NCHW -> float, scaled and standardised, optionally channels_last; floats pass."""

    def __init__(self, channels: int, device: torch.device, channels_last: bool):
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,) * channels,
                                                                         (0.25,) * channels)
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1) * 255
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = x.float().sub_(self.mean).div_(self.std)
        return x.contiguous(memory_format=self.memory_format)


def plain_batches(loader: Iterable, device: torch.device, normalize: Normalize,
                  non_blocking: bool) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Copy and normalise on the compute stream (no prefetcher, or a CPU rank)."""
    for images, labels in loader:
        images = images.to(device, non_blocking=non_blocking)
        yield normalize(images), labels.to(device, non_blocking=non_blocking)


def prefetched_batches(loader: Iterable, device: torch.device,
                       normalize: Normalize) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The APEX data_prefetcher idea: copy batch k+1 on a side stream while step k computes.

    record_stream tells the caching allocator that the compute stream uses the tensors, so their
    memory is not handed out again before that stream is done with them.
    """
    stream = torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)

    def load(batch):
        images, labels = batch
        with torch.cuda.stream(stream):
            images = normalize(images.to(device, non_blocking=True))
            labels = labels.to(device, non_blocking=True)
        return images, labels

    it = iter(loader)
    try:
        nxt = load(next(it))
    except StopIteration:
        return
    while nxt is not None:
        compute.wait_stream(stream)
        images, labels = nxt
        images.record_stream(compute)
        labels.record_stream(compute)
        try:
            nxt = load(next(it))
        except StopIteration:
            nxt = None
        yield images, labels
