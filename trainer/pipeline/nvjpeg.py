"""nvJPEG's hardware decoder (the GPU's NVJPG engines) called directly through ctypes, for
--decode gpu on CUDA: a batch is split over a few lanes, each a thread with its own decoder and
stream, so the engines are fed while the training thread runs.

nvJPEG's batched hardware decode submits every image from the host (a copy, a launch, an event,
a wait: about 40 us each); torchvision's decode_jpeg makes one such call at a time under a global
lock and waits for the batch on the host, which beside a training step took twice as long as
alone (docs/benchmarks.md, session 7).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

BACKEND_HARDWARE = 3  # nvjpegBackend_t
OUTPUT_YUV, OUTPUT_RGB = 1, 3  # nvjpegOutputFormat_t: planar YCbCr as coded, planar RGB
STATUS_ARCH_MISMATCH = 7  # no hardware decoder on this GPU
IN_FLIGHT = 3  # batches whose input bytes a lane keeps until the device has read them
# nvjpegImage_t: four channel pointers, then four pitches.
IMAGE = np.dtype([("channel", np.uint64, 4), ("pitch", np.uint64, 4)])


def _library() -> ctypes.CDLL:
    """The libnvjpeg torch's CUDA build ships (already mapped by torchvision's image ops)."""
    names = ["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"]
    for base in sys.path:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvjpeg.so*")))
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        for fn in ("nvjpegCreateEx", "nvjpegJpegStateCreate", "nvjpegDecodeBatchedInitialize",
                   "nvjpegDecodeBatched"):
            getattr(lib, fn).restype = ctypes.c_int
        return lib
    raise RuntimeError("libnvjpeg not found")


def _check(status: int, what: str) -> None:
    if status == STATUS_ARCH_MISMATCH:
        raise RuntimeError("this GPU has no hardware JPEG decoder")
    if status != 0:
        raise RuntimeError(f"{what} failed: nvjpeg status {status}")


class _Lane:
    """One decoder handle, two states used in turn (the device may still read one while the
    next batch is set up in the other) and a stream."""

    def __init__(self, lib, device: torch.device, priority: int):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        _check(lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None, 0, ctypes.byref(self.handle)),
               "nvjpegCreateEx")
        self.states = [ctypes.c_void_p(), ctypes.c_void_p()]
        for state in self.states:
            _check(lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(state)),
                   "nvjpegJpegStateCreate")
        self.stream = torch.cuda.Stream(device, priority=priority)
        self.turn = 0
        self.state_free: list[torch.cuda.Event | None] = [None, None]
        self.in_flight: deque = deque()  # (event, what the device may still read)

    def decode(self, sources: np.ndarray, lengths: np.ndarray, dest: np.ndarray, keep: object,
               ready: torch.cuda.Event, output: int = OUTPUT_RGB) -> torch.cuda.Event:
        """Queue the decode of len(sources) images on this lane's stream, after `ready` (the
        output's memory may still be read by earlier work of the stream it was taken on)."""
        if self.state_free[self.turn] is not None:
            self.state_free[self.turn].synchronize()  # two batches ago: normally long done
        state, count = self.states[self.turn], len(sources)
        with torch.cuda.device(self.stream.device), torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            _check(self.lib.nvjpegDecodeBatchedInitialize(self.handle, state, count, 1,
                                                          output),
                   "nvjpegDecodeBatchedInitialize")
            _check(self.lib.nvjpegDecodeBatched(
                self.handle, state, ctypes.c_void_p(sources.ctypes.data),
                ctypes.c_void_p(lengths.ctypes.data), ctypes.c_void_p(dest.ctypes.data),
                ctypes.c_void_p(self.stream.cuda_stream)), "nvjpegDecodeBatched")
            done = torch.cuda.Event()
            done.record(self.stream)
        self.state_free[self.turn] = done
        self.turn = 1 - self.turn
        self.in_flight.append((done, (sources, lengths, dest, keep)))
        while self.in_flight and (len(self.in_flight) > IN_FLIGHT or self.in_flight[0][0].query()):
            self.in_flight.popleft()[0].synchronize()
        return done


class HardwareJpeg:
    """JPEG bytes -> whole images (3, H, W) uint8 on the device, decoded by the NVJPG engines in
    `lanes` threads. Images the engines cannot take (progressive, CMYK, 4:1:1: flagged by the
    workers) go to `fallback`, as does a part of a batch that the engines reject."""

    crops = False

    def __init__(self, device: torch.device, fallback, lanes: int = 4, priority: int = 0):
        self.device, self.fallback = device, fallback
        lib = _library()
        with torch.cuda.device(device):  # the engines of this rank's GPU
            self.lanes = [_Lane(lib, device, priority) for _ in range(lanes)]
        self.pool = ThreadPoolExecutor(lanes, thread_name_prefix="nvjpeg")
        self.name = f"nvJPEG hardware decoder, {lanes} lanes, whole images"

    def decode(self, flat: torch.Tensor, lengths: torch.Tensor,
               boxes: torch.Tensor) -> list[torch.Tensor | None]:
        """Queued on the current stream; returns without waiting for the device."""
        n = len(lengths)
        size = lengths.numpy().astype(np.uint64)
        start = np.cumsum(size) - size
        heights, widths, ok = (boxes[:, k].numpy() for k in (5, 6, 7))
        images: list[torch.Tensor | None] = [None] * n
        groups: dict[tuple[int, int], list[int]] = {}
        for i in np.flatnonzero(ok).tolist():
            groups.setdefault((int(heights[i]), int(widths[i])), []).append(i)
        for (h, w), index in groups.items():
            # One buffer per image size: the images are views of it, in index order.
            out = torch.empty(len(index), 3, h, w, dtype=torch.uint8, device=self.device)
            dest = np.zeros(len(index), IMAGE)
            image_at = np.uint64(out.data_ptr()) + np.arange(len(index), dtype=np.uint64) * \
                np.uint64(3 * h * w)
            dest["channel"][:, :3] = image_at[:, None] + \
                np.arange(3, dtype=np.uint64) * np.uint64(h * w)
            dest["pitch"][:, :3] = w
            if not self.queue(flat, start[index], size[index], dest):
                continue  # these images go the other way
            for i, image in zip(index, out.unbind(0), strict=True):
                images[i] = image
        rest = [i for i in range(n) if images[i] is None]
        if rest:
            parts = torch.cat([flat[int(start[i]):int(start[i] + size[i])] for i in rest])
            for i, image in zip(rest, self.fallback.decode(parts, lengths[rest], boxes[rest]),
                                strict=True):
                images[i] = image
        return images

    def queue(self, flat: torch.Tensor, start: np.ndarray, size: np.ndarray, dest: np.ndarray,
              output: int = OUTPUT_RGB) -> bool:
        """Decode the JPEGs at flat + start (size bytes each) into the nvjpegImage_t entries
        `dest`, split over the lanes, once the current stream's earlier work is done; the
        current stream then waits for them. False where the engines rejected some: every
        queued lane is still waited for."""
        current = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event()
        ready.record(current)
        sources = np.uint64(flat.data_ptr()) + start
        chunks = np.array_split(np.arange(len(dest)), min(len(self.lanes), len(dest)))
        futures = [self.pool.submit(lane.decode, sources[c], size[c], dest[c], flat, ready, output)
                   for lane, c in zip(self.lanes, chunks, strict=False)]
        accepted = True
        for future in futures:
            try:
                current.wait_event(future.result())
            except RuntimeError:
                accepted = False
        return accepted
