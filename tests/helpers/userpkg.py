"""A user's `module:function` model and dataset, as a test would write them."""

import torch
from torch import nn
from torch.utils.data import Dataset


def tiny_cnn(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """Small enough that a CPU step takes milliseconds."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(8 * 16, num_classes))


class Blobs(Dataset):
    """Float images whose class is the brightest quadrant: learnable in a few steps."""

    classes = ["tl", "tr", "bl", "br"]

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        self.images = torch.rand(n, 3, 16, 16, generator=g) * 0.3
        for i, label in enumerate(self.labels.tolist()):
            r, c = divmod(label, 2)
            self.images[i, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] += 0.7

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


def blobs():
    return Blobs(512, 0), Blobs(128, 1)


class Recorder(Dataset):
    """Blobs that append every index it serves to a file (exactly-once checks)."""

    classes = Blobs.classes

    def __init__(self, path: str):
        self.inner, self.path = Blobs(512, 0), path

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        with open(self.path, "a") as f:
            f.write(f"{i}\n")
        return self.inner[i]
