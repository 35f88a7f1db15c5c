"""nvJPEG's hardware decoder (the GPU's NVJPG engines) called directly through ctypes, for
--decode gpu on CUDA: no host sync, no per-batch allocation, decodes in the caller's stream.

torchvision's decode_jpeg uses the same engines but waits on the host for every batch under a
global lock, and nvJPEG's default allocator frees with cudaFree, which waits for the whole device:
beside training that doubled the time a batch took (docs/benchmarks.md, session 7).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections import deque

import torch

BACKEND_HARDWARE, OUTPUT_RGB = 3, 3  # nvjpegBackend_t, nvjpegOutputFormat_t (planar RGB)
FLAGS_ENABLE_MEMORY_POOLS = 1 << 1
STATUS_ARCH_MISMATCH = 7  # no hardware decoder on this GPU
IN_FLIGHT = 3  # batches whose input bytes are kept until the device has read them


class Image(ctypes.Structure):  # nvjpegImage_t
    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def _library() -> ctypes.CDLL:
    """The libnvjpeg torch's CUDA build ships (already mapped by torchvision's image ops)."""
    names = ["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"]
    for base in sys.path:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvjpeg.so*")))
        names += sorted(glob.glob(os.path.join(base, "nvidia", "nvjpeg", "lib", "libnvjpeg.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("libnvjpeg not found")


class HardwareJpeg:
    """JPEG bytes -> whole images (3, H, W) uint8 on the device, decoded by the NVJPG engines.
    Images the engines cannot take (progressive, CMYK, 4:1:1; flagged by the workers) go to
    `fallback`, as does a batch the engines reject."""

    crops = False

    def __init__(self, device: torch.device, fallback, pools: bool = True):
        self.device, self.fallback = device, fallback
        self.lib = lib = _library()
        for fn in ("nvjpegCreateEx", "nvjpegJpegStateCreate", "nvjpegDecodeBatchedInitialize",
                   "nvjpegDecodeBatched"):
            getattr(lib, fn).restype = ctypes.c_int
        self.handle = ctypes.c_void_p()
        with torch.cuda.device(device):  # the engines of this rank's GPU
            status = lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None,
                                        FLAGS_ENABLE_MEMORY_POOLS if pools else 0,
                                        ctypes.byref(self.handle))
            if status == STATUS_ARCH_MISMATCH:
                raise RuntimeError("this GPU has no hardware JPEG decoder")
            self._check(status, "nvjpegCreateEx")
            # Two states, used in turn: one can be read by the device while the next batch is
            # set up in the other.
            self.states = [ctypes.c_void_p(), ctypes.c_void_p()]
            for state in self.states:
                self._check(lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(state)),
                            "nvjpegJpegStateCreate")
        self.turn = 0
        self.state_free = [None, None]  # the event after which each state may be used again
        self.in_flight: deque = deque()  # (event, what the device may still read)
        self.name = f"nvJPEG hardware decoder{' (memory pools)' if pools else ''}, whole images"

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed: nvjpeg status {status}")

    def decode(self, flat: torch.Tensor, lengths: torch.Tensor,
               boxes: torch.Tensor) -> list[torch.Tensor | None]:
        """Queued on the current stream; returns without waiting for the device."""
        n = len(lengths)
        ends = torch.cumsum(lengths, 0).tolist()
        starts = [e - n_ for e, n_ in zip(ends, lengths.tolist(), strict=True)]
        heights, widths, ok = boxes[:, 5].tolist(), boxes[:, 6].tolist(), boxes[:, 7].tolist()
        hw = [i for i in range(n) if ok[i]]
        images: list[torch.Tensor | None] = [None] * n
        if hw:
            try:
                self._decode_hw(flat, hw, starts, lengths.tolist(), heights, widths, images)
            except RuntimeError:  # a batch the engines reject goes the other way, all of it
                pass
        rest = [i for i in range(n) if images[i] is None]
        if rest:
            sub_flat = torch.cat([flat[starts[i]:ends[i]] for i in rest])
            for i, image in zip(rest, self.fallback.decode(
                    sub_flat, lengths[rest], boxes[rest]), strict=True):
                images[i] = image
        return images

    def _decode_hw(self, flat, index, starts, lengths, heights, widths, images) -> None:
        stream = torch.cuda.current_stream(self.device)
        state = self.states[self.turn]
        if self.state_free[self.turn] is not None:
            self.state_free[self.turn].synchronize()  # two batches ago: normally long done
        sizes = [3 * heights[i] * widths[i] for i in index]
        out = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
        base, offset = flat.data_ptr(), 0
        count = len(index)
        data = (ctypes.c_void_p * count)(*[base + starts[i] for i in index])
        sizes_c = (ctypes.c_size_t * count)(*[lengths[i] for i in index])
        dest = (Image * count)()
        out_ptr = out.data_ptr()
        for k, i in enumerate(index):
            plane = heights[i] * widths[i]
            for c in range(3):
                dest[k].channel[c] = out_ptr + offset + c * plane
                dest[k].pitch[c] = widths[i]
            images[i] = out[offset:offset + 3 * plane].view(3, heights[i], widths[i])
            offset += 3 * plane
        self._check(self.lib.nvjpegDecodeBatchedInitialize(self.handle, state, count, 1,
                                                           OUTPUT_RGB),
                    "nvjpegDecodeBatchedInitialize")
        status = self.lib.nvjpegDecodeBatched(self.handle, state, data, sizes_c, dest,
                                              ctypes.c_void_p(stream.cuda_stream))
        if status != 0:
            for i in index:
                images[i] = None
            self._check(status, "nvjpegDecodeBatched")
        done = torch.cuda.Event()
        done.record(stream)
        self.state_free[self.turn] = done
        self.turn = 1 - self.turn
        self.in_flight.append((done, (flat, data, sizes_c, dest)))  # in case nvJPEG reads late
        while self.in_flight and (len(self.in_flight) > IN_FLIGHT or self.in_flight[0][0].query()):
            self.in_flight.popleft()[0].synchronize()
