"""The nvImageCodec codec for --decode gpu (the optional extra ddptui[nvimgcodec], chosen with
DDPTUI_DECODER=nvimgcodec): decodes only each sample's crop, on the GPU's JPEG engines.

DDPTUI_NVIMGCODEC tunes it: backends in order of preference from hw (the NVJPG engines), gpu
(CUDA on the SMs), hybrid (Huffman on CPU threads), all (its own choice), plus `whole` to decode
whole images instead of regions; e.g. DDPTUI_NVIMGCODEC=all,whole.
"""

from __future__ import annotations

import os
from collections import deque

import numpy as np
import torch

DEFAULT_BACKENDS = ("hw", "gpu")


class NvImageCodec:
    """JPEG bytes -> uint8 tensors on the device: each crop (H, W, 3), or each whole image
    (3, H, W) with `whole`."""

    def __init__(self, device: torch.device, tuning: str = ""):
        os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "1")  # errors only, not a line per crop
        from nvidia import nvimgcodec as nv

        words = [w for w in tuning.replace(" ", "").split(",") if w]
        kinds = {"hw": nv.BackendKind.HW_GPU_ONLY, "gpu": nv.BackendKind.GPU_ONLY,
                 "hybrid": nv.BackendKind.HYBRID_CPU_GPU}
        chosen = [w for w in words if w in kinds or w == "all"] or list(DEFAULT_BACKENDS)
        self.cuda = device.type == "cuda"
        if self.cuda:  # "all": nvImageCodec's own choice among every backend it has
            backends = None if "all" in chosen else [nv.Backend(kinds[w]) for w in chosen]
            device_id = device.index if device.index is not None else torch.cuda.current_device()
        else:  # a CPU rank (the test suite's gloo runs): libjpeg-turbo in the rank process
            chosen, backends = ["cpu"], [nv.Backend(nv.BackendKind.CPU_ONLY)]
            device_id = nv.NVIMGCODEC_DEVICE_CPU_ONLY
        self.crops = "whole" not in words
        self.nv, self.device = nv, device
        # The engines' region decode is off with fancy upsampling before nvJPEG 13.2 (torch's
        # own may be older) for a possible 1-pixel error at a crop's edge: harmless here.
        self.decoder = nv.Decoder(device_id=device_id, backends=backends,
                                  options="nvjpeg_hw_decoder:enable_roi_fancy_upsampling=1")
        self.params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
                                      sample_format=nv.SampleFormat.I_RGB)
        # The last batches' bytes stay referenced while their copies may still be in flight.
        self.recent: deque = deque(maxlen=4)
        self.name = (f"nvImageCodec {getattr(nv, '__version__', '')} ({', '.join(chosen)}; "
                     f"{'crop regions' if self.crops else 'whole images'})")

    def decode(self, flat: torch.Tensor, lengths: torch.Tensor,
               boxes: torch.Tensor) -> list[torch.Tensor | None]:
        """None where an image cannot be decoded."""
        nv, raw = self.nv, flat.numpy()
        ends = np.cumsum(lengths.numpy())
        streams = []
        for end, length, (top, left, height, width) in zip(
                ends.tolist(), lengths.tolist(), boxes[:, :4].tolist(), strict=True):
            stream = nv.CodeStream(raw[end - length:end])
            if self.crops:
                stream = stream.get_sub_code_stream(
                    region=nv.Region(top, left, top + height, left + width))
            streams.append(stream)
        cuda_stream = torch.cuda.current_stream(self.device).cuda_stream if self.cuda else 0
        images = self.decoder.decode(streams, params=self.params, cuda_stream=cuda_stream)
        self.recent.append((flat, streams))
        out = [None if image is None else torch.from_dlpack(image) if self.cuda
               else torch.from_numpy(np.asarray(image)) for image in images]
        return out if self.crops else [None if image is None else image.permute(2, 0, 1)
                                       for image in out]
