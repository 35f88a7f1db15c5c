"""Crop, resize and flip a batch of differently sized images in a few batched kernels, for the
GPU decode path: each image's box becomes two interpolation matrices applied as batched products.

The filter is antialiased bilinear (a triangle as wide as the scale when shrinking), what PIL and
torchvision's antialias=True resize use, so both decode paths augment like the CPU path.
"""

from __future__ import annotations

import torch


def interpolation_weights(start: torch.Tensor, length: torch.Tensor, size: int,
                          extent: int) -> torch.Tensor:
    """(N, size, extent) rows that resample the span [start, start + length) of an axis of
    `extent` pixels to `size` pixels; pixels outside the span weigh nothing."""
    device = start.device
    scale = length / size
    support = scale.clamp(min=1.0)  # widen the triangle when shrinking: averages, no aliasing
    centres = start[:, None] + (torch.arange(size, device=device) + 0.5) * scale[:, None]
    pixels = torch.arange(extent, device=device) + 0.5
    w = (1 - (pixels - centres[..., None]).abs() / support[:, None, None]).clamp_(min=0)
    inside = (pixels >= start[:, None]) & (pixels < (start + length)[:, None])
    w.mul_(inside[:, None, :])
    return w.div_(w.sum(-1, keepdim=True))


def crop_resize(canvas: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor, size: int,
                dtype: torch.dtype) -> torch.Tensor:
    """canvas: (N, H, W, 3) uint8, image i in its top-left corner (the rest is never read:
    weights there are 0 and uint8 holds no NaN); boxes: (N, 4) float [top, left, height, width]
    within each image; flip: (N,) bool. Returns (N, 3, size, size) on the 0-255 scale in
    `dtype` (float16 on CUDA: the products run on tensor cores)."""
    n, height, width, _ = canvas.shape
    rows = interpolation_weights(boxes[:, 0], boxes[:, 2], size, height).to(dtype)
    cols = interpolation_weights(boxes[:, 1], boxes[:, 3], size, width)
    cols = torch.where(flip[:, None, None], cols.flip(1), cols).to(dtype)
    # Rows first: the crop shrinks to `size` rows before the copy that puts columns last.
    tall = torch.bmm(rows, canvas.view(n, height, width * 3).to(dtype))  # (N, size, W*3)
    tall = tall.view(n, size, width, 3).permute(0, 1, 3, 2).reshape(n, size * 3, width)
    out = torch.bmm(tall, cols.transpose(1, 2))  # (N, size*3, size): [n][y][c][x]
    return out.view(n, size, 3, size).permute(0, 2, 1, 3)
