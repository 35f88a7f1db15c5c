"""Datasets and loaders for every --data kind, with the transforms and the sampler wired in.

Image sets yield uint8 CHW tensors (normalisation happens on the device, see prefetch.py);
`synthetic` makes its batches on the device and measures compute alone. torchvision is imported
where it is used: it costs a rank 1.1 s (torch._dynamo, through its ops), which a user's own
model and data never need.
"""

from __future__ import annotations

import gc
import importlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset

from ddptui.contract.options.config import RunConfig
from ddptui.contract.options.errors import DataError, UsageError
from ddptui.contract.options.training import importable_from_cwd
from ddptui.rank.elastic.lifeline import descends_from, die_with_parent
from ddptui.rank.sampler import ShardedBatchSampler, seed_sample, shard_indices
from ddptui_trainer.pipeline.badsamples import BadSample, first_readable
from ddptui_trainer.pipeline.forkserver import worker_context
from ddptui_trainer.pipeline.shapes import ensure_shapes

SYNTHETIC_SAMPLES = 1_281_167  # an ImageNet epoch
SYNTHETIC_CLASSES = 1000


@dataclass
class DataBundle:
    train: Dataset | None  # None for synthetic
    val: Dataset | None
    num_train: int
    num_classes: int
    in_channels: int
    collate: Callable | None = None  # --decode gpu: batches of JPEG bytes and crop boxes


class KeyedDataset(Dataset):
    """Applies a transform to a base dataset and accepts the sampler's (epoch, index) keys.

    With a seed, each sample's augmentation is seeded by (seed, epoch, index): the same sample
    gets the same crop whatever worker, world size or resume point produced it.
    """

    def __init__(self, base: Dataset, transform: Callable | None, seed: int | None = None):
        self.base, self.transform, self.seed = base, transform, seed
        self.notes: str | None = None  # where skipped samples are noted (None: fail at one)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key):
        epoch, index = key if isinstance(key, tuple) else (0, key)
        index, image, label = first_readable(self._load, index, len(self.base), epoch,
                                             lambda i: _describe(self.base, i), self.notes)
        if self.seed is not None:
            seed_sample(self.seed, epoch, index)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(label)

    def _load(self, index: int):
        try:
            return (index, *self.base[index])
        except (OSError, SyntaxError, ValueError) as e:  # PIL's ways of saying "not an image"
            raise BadSample(str(e).split(" <")[0]) from None  # PIL appends the file's repr


def _describe(base: Dataset, index: int) -> str:
    samples = getattr(base, "samples", None)
    return samples[index][0] if samples else f"#{index}"


def build_datasets(config: RunConfig, progress: Callable[[str], None] = print) -> DataBundle:
    """Open (or generate) the configured data; user mistakes raise UsageError or DataError."""
    kind, path, size = config.data.kind, config.data.path, config.data.resolved_image_size
    seed = config.train.seed if config.train.deterministic else None
    if kind == "synthetic":
        return DataBundle(None, None, SYNTHETIC_SAMPLES, SYNTHETIC_CLASSES, 3)
    gpu = config.data.decode == "gpu"
    if kind == "shapes":
        root = ensure_shapes(lambda done, total: progress(f"generating shapes dataset {done}/{total}"))
        return _imagefolder(os.path.join(root, "train"), os.path.join(root, "val"), size, seed, gpu)
    if kind == "imagefolder":
        train_dir = os.path.join(path, "train")
        if os.path.isdir(train_dir):
            val_dir = os.path.join(path, "val")
            return _imagefolder(train_dir, val_dir if os.path.isdir(val_dir) else None, size, seed,
                                gpu)
        return _imagefolder(path, None, size, seed, gpu)
    if kind in ("cifar10", "mnist", "fashion-mnist"):
        from torchvision import datasets, transforms

        cls = {"cifar10": datasets.CIFAR10, "mnist": datasets.MNIST,
               "fashion-mnist": datasets.FashionMNIST}[kind]
        try:  # never downloaded: torchvision's "not found or corrupted" is the user's to fix
            train, val = cls(path, train=True, download=False), cls(path, train=False, download=False)
        except (RuntimeError, OSError, ValueError) as e:
            raise UsageError(f"cannot read {kind} at {path}: {_first_line(e)}") from None
        if kind == "cifar10":
            aug = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
            return _small(train, val, 3, aug, size, 32, seed)
        return _small(train, val, 1, [], size, 28, seed)
    return _custom(config.data.spec, size, seed)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _imagefolder(train_dir: str, val_dir: str | None, size: int, seed: int | None,
                 gpu: bool = False) -> DataBundle:
    from torchvision import datasets
    from torchvision.transforms import v2

    try:
        train = datasets.ImageFolder(train_dir, loader=load_image)
    except (FileNotFoundError, RuntimeError) as e:
        raise UsageError(f"no images found under {train_dir}: {e}") from None
    # The same draws as the PIL transforms of the ImageNet example, on uint8 tensors.
    train_tf = v2.Compose([
        v2.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
    ])
    val_tf = v2.Compose([v2.Resize(int(size * 8 / 7), antialias=True), v2.CenterCrop(size)])
    if val_dir:
        val = datasets.ImageFolder(val_dir, loader=load_image)
    else:  # hold out every 20th image so each epoch still reports val accuracy
        every = list(range(len(train)))
        val = Subset(datasets.ImageFolder(train_dir, loader=load_image), every[::20])
        train = Subset(train, [i for i in every if i % 20])
        train.samples = [train.dataset.samples[i] for i in train.indices]
        val.samples = [val.dataset.samples[i] for i in val.indices]
    classes = train.classes if hasattr(train, "classes") else train.dataset.classes
    if gpu:
        from ddptui_trainer.pipeline.gpudecode import JpegFiles, collate

        return DataBundle(JpegFiles(train.samples, size, True, seed),
                          JpegFiles(val.samples, size, False), len(train), len(classes), 3,
                          collate=collate)
    return DataBundle(KeyedDataset(train, train_tf, seed), KeyedDataset(val, val_tf), len(train),
                      len(classes), 3)


def load_image(path: str) -> torch.Tensor:
    """An image file as uint8 RGB (3, H, W): JPEG, PNG, GIF and WebP decoded by torchvision
    (libjpeg-turbo, libpng), which with the tensor transforms does 1.5x the images a second of
    PIL's path (docs/benchmarks.md, the input pipeline); PIL for the rest, and to name what is wrong
    with a file neither can read."""
    from torchvision import transforms
    from torchvision.io import ImageReadMode, decode_image

    with open(path, "rb") as f:
        data = f.read()
    try:
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                             mode=ImageReadMode.RGB)
        if image.dtype == torch.uint8:
            return image
    except RuntimeError:
        pass
    with Image.open(io.BytesIO(data)) as im:
        return transforms.functional.pil_to_tensor(im.convert("RGB"))


def _small(train: Dataset, val: Dataset, channels: int, aug: list, size: int, native: int,
           seed: int | None) -> DataBundle:
    from torchvision import transforms

    resize = [transforms.Resize(size, antialias=True)] if size != native else []
    train_tf = transforms.Compose(resize + aug + [transforms.PILToTensor()])
    val_tf = transforms.Compose(resize + [transforms.PILToTensor()])
    return DataBundle(KeyedDataset(train, train_tf, seed), KeyedDataset(val, val_tf), len(train),
                      len(train.classes), channels)


def _custom(spec: str, size: int, seed: int | None) -> DataBundle:
    fn = load_callable(spec, "data")
    made = fn()
    train, val = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    for part in (train, val) if val is not None else (train,):
        if not hasattr(part, "__getitem__") or not hasattr(part, "__len__") or len(part) == 0:
            raise DataError(f"data {spec} returned {type(part).__name__}: it must return a "
                            "non-empty map-style Dataset, or a (train, val) pair of them")
    image = _sample_image(spec, train[0])
    if isinstance(image, Image.Image):  # PIL: give it the ImageFolder treatment
        from torchvision import transforms

        channels = 1 if image.mode in ("L", "I", "F") else 3
        tf = transforms.Compose([transforms.Resize((size, size), antialias=True),
                                 transforms.PILToTensor()])
    else:
        channels, tf = int(image.shape[0]), None
    classes = getattr(train, "classes", None)
    num_classes = len(classes) if classes else getattr(train, "num_classes", None)
    if not num_classes:  # no metadata: count the labels once
        num_classes = 1 + max(int(train[i][1]) for i in range(len(train)))
    return DataBundle(KeyedDataset(train, tf, seed), KeyedDataset(val, tf) if val else None,
                      len(train), int(num_classes), channels)


def _sample_image(spec: str, sample) -> Image.Image | torch.Tensor:
    """The image of a custom dataset's sample, which must be an (image, label) pair."""
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise DataError(f"data {spec}: a sample is {type(sample).__name__}; each must be an "
                        "(image, label) pair")
    image = sample[0]
    if isinstance(image, Image.Image) or isinstance(image, torch.Tensor) and image.dim() == 3:
        return image
    shape = f" of shape {tuple(image.shape)}" if hasattr(image, "shape") else ""
    raise DataError(f"data {spec}: an image is {type(image).__name__}{shape}; it must be a "
                    "(channels, height, width) tensor or a PIL image")


def load_callable(spec: str, what: str) -> Callable:
    """Import `pkg.module:function`; a missing one is the user's mistake (UsageError)."""
    module_name, _, attr = spec.partition(":")
    importable_from_cwd()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"cannot import {what} module {module_name}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"{what} {spec}: {module_name} has no function {attr}")
    return fn


def build_train_loader(bundle: DataBundle, sampler: ShardedBatchSampler, workers: int,
                       cuda: bool) -> DataLoader:
    """The training DataLoader over the sampler's remaining batches (pinned for CUDA)."""
    return DataLoader(bundle.train, batch_sampler=sampler, num_workers=workers,
                      collate_fn=bundle.collate, pin_memory=cuda, persistent_workers=workers > 0,
                      prefetch_factor=4 if workers > 0 else None,
                      worker_init_fn=partial(worker_init, os.getpid()),
                      multiprocessing_context=worker_context(cuda) if workers else None)


def build_val_loader(bundle: DataBundle, batch_size: int, rank: int, world_size: int,
                     workers: int, cuda: bool) -> DataLoader | None:
    if bundle.val is None:
        return None
    shard = Subset(bundle.val, shard_indices(len(bundle.val), rank, world_size))
    return DataLoader(shard, batch_size=batch_size, num_workers=workers, pin_memory=cuda,
                      collate_fn=bundle.collate,
                      persistent_workers=workers > 0,
                      worker_init_fn=partial(worker_init, os.getpid()),
                      multiprocessing_context=worker_context(cuda) if workers else None)


def worker_init(rank_pid: int, _worker_id: int) -> None:
    """DataLoader workers die with their rank, even one killed with SIGKILL (no orphans), and
    leave the objects they inherited out of garbage collection: a collection walking the rank's
    whole heap in a forked worker wrote to (and so copied) every page of it, about 1 s each
    time, one of them as the worker exited."""
    die_with_parent()
    # A rank that died while this worker was still starting sends no parent-death signal, and
    # DataLoader's own watchdog takes the orphan's new parent for its own: found alive 35
    # minutes after its rank was killed mid-start.
    if not descends_from(rank_pid):
        os._exit(1)
    gc.freeze()


class SyntheticBatches:
    """Random batches made once on the device and served len(sampler) times: compute alone."""

    def __init__(self, sampler: ShardedBatchSampler, batch_size: int, image_size: int,
                 num_classes: int, device: torch.device, channels_last: bool):
        self.sampler = sampler
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(batch_size, 3, image_size, image_size, device=device, generator=g)
        self.images = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        self.labels = torch.randint(0, num_classes, (batch_size,), device=device, generator=g)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(len(self.sampler)):
            yield self.images, self.labels
