"""Moving batches to the device: the CUDA side-stream prefetcher, the threaded one for GPU
JPEG decode, and the plain path.

All run a `prepare` step (copy + normalise, or GPU JPEG decode) that leaves normalised float
tensors on the device, so CPU workers never do float maths; the prefetchers overlap the
preparation of batch k+1 with step k.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator

import torch

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Normalize:
    """uint8 NCHW -> float, scaled and standardised, optionally channels_last; floats pass.
    `dtype`: what the batch is stored as, the autocast dtype under --amp (the model's first
    layer would cast it so anyway: the batches waiting in the queue take half the memory)."""

    def __init__(self, channels: int, device: torch.device, channels_last: bool,
                 dtype: torch.dtype = torch.float32):
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,) * channels,
                                                                         (0.25,) * channels)
        mean = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255
        std = torch.tensor(std, device=device).view(1, -1, 1, 1) * 255
        self.scale, self.shift = 1 / std, -mean / std  # (x - mean) / std = x * scale + shift
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = self.standardize(x.float())
        return x.contiguous(memory_format=self.memory_format)

    def standardize(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """A float batch on the 0-255 scale, standardised in the model's layout: one pass over
        the batch, not three (subtract, divide, change layout)."""
        if out is None:
            out = torch.empty_like(x, memory_format=self.memory_format, dtype=self.dtype)
        return torch.addcmul(self.shift, x, self.scale, out=out)  # in float, then stored


class ToDevice:
    """A loader batch of uint8 images -> normalised images and labels on the device."""

    def __init__(self, device: torch.device, normalize: Normalize):
        self.device, self.normalize = device, normalize
        self.non_blocking = device.type == "cuda"

    def __call__(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        images = images.to(self.device, non_blocking=self.non_blocking)
        return self.normalize(images), labels.to(self.device, non_blocking=self.non_blocking)


def plain_batches(loader: Iterable, prepare,
                  mark=lambda phase: None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Prepare each batch on the compute stream (no prefetcher, or a CPU rank); `mark("h2d")`
    as each one's preparation begins (a step clock's)."""
    for batch in loader:
        mark("h2d")
        yield prepare(batch)


def prefetched_batches(loader: Iterable, device: torch.device, prepare,
                       stream: torch.cuda.Stream) -> Iterator:
    """The APEX data_prefetcher idea: copy batch k+1 on a side stream while step k computes.

    record_stream tells the caching allocator that the compute stream uses the tensors, so their
    memory is not handed out again before that stream is done with them. `stream` is the
    run's one side stream (side_stream): the allocator keeps a pool per stream, and a new
    stream each epoch would leave the last one's pool cached and unused.
    """
    compute = torch.cuda.current_stream(device)

    def load(batch):
        with torch.cuda.stream(stream):
            return prepare(batch)

    it = iter(loader)
    try:
        nxt = load(next(it))
    except StopIteration:
        return
    while nxt is not None:
        compute.wait_stream(stream)
        batch = nxt
        for t in tensors_of(batch):  # images and labels, or whatever a user's batch holds
            t.record_stream(compute)
        try:
            nxt = load(next(it))
        except StopIteration:
            nxt = None
        yield batch


def tensors_of(batch) -> list[torch.Tensor]:
    """Every tensor in a batch: a tensor, or tuples, lists and dicts of them."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return [t for item in batch for t in tensors_of(item)]
    return []


def to_device(batch, device: torch.device):
    """A user's batch (tensors, tuples, lists, dicts of them) with every tensor on `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The stream a rank prepares batches on, for the whole run (None off CUDA). One, not one
    per epoch: the caching allocator's blocks belong to a stream, so each new stream cached a
    decode working set of its own (docs/benchmarks.md, the input pipeline)."""
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def threaded_batches(loader: Iterable, device: torch.device, prepare, stream: torch.cuda.Stream | None,
                     depth: int = 2) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A thread takes batches from the loader and prepares them (on `stream`, side_stream's, on
    CUDA; None off it) up to `depth` ahead of the step. For --decode gpu: decode_jpeg on the
    device returns only once the batch is decoded (about 8 ms for 128 images), time the training
    thread would otherwise spend not launching the step's kernels. The thread has ended when
    this generator is closed."""
    # Workers start here, on this thread: forked from one that ends, they would get the
    # parent-death signal they ask for (ddptui/rank/elastic/lifeline.py) with it.
    preparer = _Preparer(iter(loader), device, prepare, depth, stream)
    preparer.start()
    compute = torch.cuda.current_stream(device) if device.type == "cuda" else None
    try:
        while (item := preparer.ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            images, labels, done = item
            if done is not None:
                compute.wait_event(done)
                images.record_stream(compute)
                labels.record_stream(compute)
            yield images, labels
    finally:
        preparer.stop()


class _Preparer(threading.Thread):
    """Prepares batches on a side stream and hands them over through a bounded queue: the
    batch, then None at the end, or the exception that ended it (raised on the training
    thread)."""

    def __init__(self, batches: Iterator, device: torch.device, prepare, depth: int,
                 stream: torch.cuda.Stream | None):
        super().__init__(name="prepare", daemon=True)
        self.batches, self.device, self.prepare = batches, device, prepare
        self.cuda = device.type == "cuda"
        self.stream = stream
        self.ready: queue.Queue = queue.Queue(depth)
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            if self.cuda:
                torch.cuda.set_device(self.device)  # the current device is per thread
            with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                for batch in self.batches:
                    images, labels = self.prepare(batch)
                    done = torch.cuda.Event() if self.cuda else None
                    if done is not None:
                        done.record(self.stream)
                    if not self._offer((images, labels, done)):
                        return
            self._offer(None)
        except BaseException as e:  # raised again on the training thread
            self._offer(e)

    def _offer(self, item) -> bool:
        while not self.halt.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def stop(self) -> None:
        self.halt.set()
        while self.is_alive():  # it may be waiting to hand over a batch: take it
            with contextlib.suppress(queue.Empty):
                self.ready.get(timeout=0.1)
        self.join()
