"""Why GPU JPEG decode and training do not overlap on one GPU (issue 14 part 1): resnet18 (bf16,
channels_last, bs 256) trained from a decode thread, in variants that each take one suspect away.

python bench/overlap_probe.py /tmp/jpeg --steps 40 [--variants ...] [--trace DIR]
Each variant prints img/s, the GPU time of a training step (CUDA events around it) and the gap
between steps (time the compute stream had nothing of the step's to run). Like a rank, it gives
each stream a hardware queue of its own; CUDA_DEVICE_MAX_CONNECTIONS=8 measures as sessions 7-9 did.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import statistics
import time
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision.models import resnet18
from torchvision.ops import roi_align

from trainer.bootstrap import separate_hardware_queues
from trainer.pipeline.forkserver import worker_context
from trainer.pipeline.gpudecode import Decoder, JpegFiles, TorchvisionCodec, collate
from trainer.pipeline.nvjpeg import IMAGE, OUTPUT_YUV, HardwareJpeg
from trainer.pipeline.prefetch import Normalize, threaded_batches

VARIANTS = ["train", "graph", "tv:decode+train", "tv:decode+graph", "hw2:decode+train",
            "hw2:decode+graph", "tv:decode+train:dl", "tv:decode+graph:dl", "train"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--batches", type=int, default=16, help="distinct JPEG batches, cycled")
    ap.add_argument("--variants", nargs="+", default=VARIANTS,
                    help="train, graph (the step replayed from a CUDA graph), or "
                         "CODEC:WHAT[:hp|:dl|:cpuNN|:nopin|:aff|:gcN] with CODEC tv|hwN (N lanes), "
                         "WHAT decode, decode+train, decode+graph, rawdecode+train; hp: a "
                         "high-priority decode stream; dl: batches from a DataLoader reading the "
                         "files (nopin: not pinned; aff: the probe's threads on two whole "
                         "cores, the workers on the rest); cpuNN: NN%% of each batch arrives "
                         "decoded, as CPU workers would send it; gcN: training on N SMs (a "
                         "green context), the decoder on all")
    ap.add_argument("--workers", type=int, default=8, help="DataLoader workers for :dl variants")
    ap.add_argument("--trace", help="write a torch.profiler trace of --trace-variant here")
    ap.add_argument("--trace-variant", default="tv:decode+train")
    args = ap.parse_args()
    separate_hardware_queues()  # as a rank does, before CUDA starts
    device = torch.device("cuda", 0)
    everywhere = os.sched_getaffinity(0)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    files = JpegFiles(datasets.ImageFolder(args.root).samples, 224, train=True, seed=0)
    bs = args.batch_size
    jpegs = [collate([files[(0, b * bs + i)] for i in range(bs)]) for b in range(args.batches)]
    jpegs = [(b[0].pin_memory(), *b[1:]) for b in jpegs]
    normalize = Normalize(3, device, channels_last=True)
    tv = TorchvisionCodec(device)
    codecs = {"tv": tv, "hw1": HardwareJpeg(device, tv, 1), "hw2": HardwareJpeg(device, tv, 2),
              "hw4": HardwareJpeg(device, tv, 4), "hw8": HardwareJpeg(device, tv, 8),
              "hw4hp": HardwareJpeg(device, tv, 4, priority=-1)}
    codecs |= {"yuv1": YuvEngines(codecs["hw1"]), "yuv2": YuvEngines(codecs["hw2"]),
               "yuv4": YuvEngines(codecs["hw4"])}
    check(codecs["hw4"], tv, jpegs[0])
    check_yuv(codecs["yuv2"], Decoder(device, 224, normalize, tv, undecodable=print), jpegs[0])
    model = resnet18(num_classes=10).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    x = torch.randn(bs, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (bs,), device=device)

    def step(images, labels):
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    graphed = {}

    def graph_step(images, labels):
        """The same step replayed from a CUDA graph: one launch for the whole step."""
        if not graphed:
            sx, sy = x.clone(), y.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step(sx, sy)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
                    loss = F.cross_entropy(model(sx), sy)
                loss.backward()
                opt.step()
            graphed.update(g=g, x=sx, y=sy)
        graphed["x"].copy_(images)
        graphed["y"].copy_(labels)
        graphed["g"].replay()

    def source(variant: str, n: int):
        if variant in ("train", "graph"):
            return itertools.repeat((x, y), n)
        name, what, *hp = variant.split(":")
        codec = codecs[name]
        if isinstance(codec, YuvEngines):
            def prepare(batch):
                if what.startswith("rawdecode"):
                    codec.planes(batch[0], batch[1], batch[2])
                    return x, y
                images = codec.resized(batch[0], batch[1], batch[2], 224)
                return normalize.standardize(images), batch[3].to(device, non_blocking=True)
        elif what.startswith("rawdecode"):
            def prepare(batch):
                codec.decode(batch[0], batch[1], batch[2])
                return x, y
        else:
            prepare = Decoder(device, 224, normalize, codec, undecodable=print)
        batches = itertools.islice(itertools.cycle(jpegs), n)
        share = next((int(h[3:]) / 100 for h in hp if h.startswith("cpu")), 0.0)
        if share:  # the GPU decodes the rest: what a CPU share of each batch would save it
            if "dl" in hp:
                raise SystemExit(f"{variant}: cpuNN takes the probe's own batches, not dl's")
            prepare = split(jpegs, files, prepare, normalize, device, share)
        if "dl" in hp:  # through a DataLoader reading the files, as a rank does
            keys = [[(0, (b * bs + i) % len(files)) for i in range(bs)] for b in range(n)]
            # aff: the probe's threads on two whole cores, the workers on the others
            mine, theirs = split_cores(2) if "aff" in hp else (everywhere, None)
            for tid in os.listdir("/proc/self/task"):
                os.sched_setaffinity(int(tid), mine)
            batches = DataLoader(files, batch_sampler=keys, num_workers=args.workers,
                                 collate_fn=collate, pin_memory="nopin" not in hp,
                                 prefetch_factor=4, multiprocessing_context=worker_context(True),
                                 worker_init_fn=partial(_pin_worker, theirs)
                                 if theirs else None)
        return threaded_batches(batches, device, prepare, priority=-1 if "hp" in hp else 0)

    for name in args.variants:
        variant, sms = without_gc(name)
        with torch.cuda.stream(green_stream(device, sms)) if sms else contextlib.nullcontext():
            warm, n = 8, args.steps
            train = "train" in variant or "graph" in variant
            run = graph_step if "graph" in variant else step
            it = iter(source(variant, warm + n))
            for _ in range(warm):
                images, labels = next(it)
                if train:
                    run(images, labels)
            torch.cuda.current_stream().synchronize()  # a green context's stream too
            torch.cuda.synchronize()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
            waited = 0.0
            t = time.perf_counter()
            for i in range(n):
                w = time.perf_counter()
                images, labels = next(it)
                waited += time.perf_counter() - w
                starts[i].record()
                if train:
                    run(images, labels)
                ends[i].record()
            torch.cuda.current_stream().synchronize()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            gpu = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
            gaps = [ends[i - 1].elapsed_time(starts[i]) for i in range(1, n)]
            print(json.dumps({
                "variant": name, "img_s": round(n * bs / seconds),
                "step_gpu_ms_median": round(statistics.median(gpu), 2),
                "gap_ms_median": round(statistics.median(gaps), 2),
                "host_wait_for_batch_ms_per_step": round(1000 * waited / n, 2),
                "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}), flush=True)
            if hasattr(it, "close"):
                it.close()
    if args.trace:
        trace(args.trace, args.trace_variant, source, step)


def split(jpegs: list, files, prepare, normalize: Normalize, device: torch.device,
          share: float):
    """A prepare for the batches of `jpegs` in which each batch's last `share` of samples
    arrive as finished uint8 crops (pinned, as DataLoader workers would deliver them) and only
    the first part is decoded on the GPU."""
    bs = len(jpegs[0][1])
    keep = bs - round(share * bs)
    crops = torch.randint(0, 256, (bs - keep, 3, 224, 224), dtype=torch.uint8)
    labels = torch.randint(0, 10, (bs - keep,))
    pin = device.type == "cuda"
    if pin:
        crops, labels = crops.pin_memory(), labels.pin_memory()
    parts = {}
    for k, batch in enumerate(jpegs):
        part = collate([files[(0, k * bs + i)] for i in range(keep)])
        parts[id(batch)] = (part[0].pin_memory() if pin else part[0], *part[1:])

    def both(batch):
        images, y = prepare(parts[id(batch)])
        done = normalize(crops.to(device, non_blocking=pin))
        return torch.cat([images, done]), torch.cat([y, labels.to(device, non_blocking=pin)])

    return both


class YuvEngines:
    """The engines' lanes decoding to planar YCbCr as coded (4:2:0 here) instead of RGB: the
    crop is resized plane by plane (chroma at half scale) and turned into RGB at 224 x 224, so
    no full-size RGB image is written, and the float resize reads 1.5 bytes a pixel, not 3."""

    def __init__(self, hw: HardwareJpeg):
        self.hw, self.device = hw, hw.device
        self.name = hw.name.replace("whole images", "YCbCr 4:2:0 planes")

    def planes(self, flat, lengths, boxes):
        """[(index, luma (n, 1, h, w), chroma (n, 2, h/2, w/2))] per image size, queued on the
        current stream."""
        size = lengths.numpy().astype(np.uint64)
        start = np.cumsum(size) - size
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (h, w) in enumerate(boxes[:, 5:7].tolist()):
            groups.setdefault((h, w), []).append(i)
        out = []
        for (h, w), index in groups.items():
            ch, cw = (h + 1) // 2, (w + 1) // 2
            luma = torch.empty(len(index), 1, h, w, dtype=torch.uint8, device=self.device)
            chroma = torch.empty(len(index), 2, ch, cw, dtype=torch.uint8, device=self.device)
            dest = np.zeros(len(index), IMAGE)
            k = np.arange(len(index), dtype=np.uint64)
            dest["channel"][:, 0] = np.uint64(luma.data_ptr()) + k * np.uint64(h * w)
            dest["channel"][:, 1] = np.uint64(chroma.data_ptr()) + k * np.uint64(2 * ch * cw)
            dest["channel"][:, 2] = dest["channel"][:, 1] + np.uint64(ch * cw)
            dest["pitch"][:, 0], dest["pitch"][:, 1:3] = w, cw
            if not self.hw.queue(flat, start[index], size[index], dest, OUTPUT_YUV):
                raise SystemExit("the engines rejected a JPEG of the probe's set")
            out.append((index, luma, chroma))
        return out

    def resized(self, flat, lengths, boxes, size: int) -> torch.Tensor:
        """(n, 3, size, size) float RGB on the 0-255 scale, cropped, resized and flipped."""
        result = torch.empty(len(lengths), 3, size, size, device=self.device)
        rois = boxes.to(torch.float32)
        for index, luma, chroma in self.planes(flat, lengths, boxes):
            top, left, h, w = (rois[index, k] for k in range(4))
            n = torch.arange(len(index), dtype=torch.float32)
            box = torch.stack([n, left, top, left + w, top + h], 1).to(self.device,
                                                                       non_blocking=True)
            half = box * torch.tensor([1, 0.5, 0.5, 0.5, 0.5], device=self.device)
            yy = roi_align(luma.float(), box, (size, size), aligned=True, sampling_ratio=-1)
            cc = roi_align(chroma.float(), half, (size, size), aligned=True,
                           sampling_ratio=-1) - 128
            cb, cr = cc[:, :1], cc[:, 1:]
            result[index] = torch.cat([yy + 1.402 * cr, yy - 0.344136 * cb - 0.714136 * cr,
                                       yy + 1.772 * cb], 1).clamp_(0, 255)
        flip = boxes[:, 4].bool()
        if flip.any():
            flip = flip.to(self.device, non_blocking=True)
            result = torch.where(flip.view(-1, 1, 1, 1), result.flip(-1), result)
        return result


def check_yuv(yuv: YuvEngines, rgb: Decoder, batch) -> None:
    """The YCbCr path's crops against the RGB path's (torchvision's decoder, roi_align)."""
    a = yuv.resized(batch[0], batch[1], batch[2], 224)
    b = rgb._crop_and_resize(rgb.codec.decode(batch[0], batch[1], batch[2]), batch[2])
    d = (a - b).abs()
    print(json.dumps({"check": yuv.name, "max_abs_diff": round(d.max().item(), 2),
                      "mean_abs_diff": round(d.mean().item(), 3),
                      "p99_abs_diff": round(d.flatten()[::97].quantile(0.99).item(), 2)}),
          flush=True)


def without_gc(variant: str) -> tuple[str, int]:
    """"...:gcN" -> the variant without it, and N: the training runs on a green context of N
    SMs, the decoder's streams keep the whole GPU (so the SMs left over are the decoder's)."""
    parts = variant.split(":")
    sms = [int(p[2:]) for p in parts if p.startswith("gc")]
    return ":".join(p for p in parts if not p.startswith("gc")), (sms[0] if sms else 0)


@functools.cache
def green_stream(device: torch.device, sms: int) -> torch.cuda.Stream:
    """A stream whose kernels run on `sms` of the GPU's SMs only."""
    green = torch.cuda.green_contexts.GreenContext.create(sms, device.index)
    s = green.Stream()
    stream = torch.cuda.Stream(stream_id=s.stream_id, device_index=s.device_index,
                               device_type=s.device_type)
    stream.green = green  # keeps the context alive
    return stream


def _pin_worker(cpus: set[int], _worker_id: int) -> None:
    os.sched_setaffinity(0, cpus)


def split_cores(n: int) -> tuple[set[int], set[int]]:
    """The logical CPUs of `n` whole physical cores (hyperthread siblings included), and the
    rest."""
    cpus = sorted(os.sched_getaffinity(0))
    mine: set[int] = set()
    for cpu in cpus:
        if n == 0:
            break
        if cpu not in mine:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                siblings = f.read().strip().replace("-", ",").split(",")
            mine |= {int(c) for c in siblings if int(c) in cpus}
            n -= 1
    return mine, set(cpus) - mine


def check(hw, tv, batch) -> None:
    """The engines' images against torchvision's for the same bytes."""
    a = hw.decode(batch[0], batch[1], batch[2])
    b = tv.decode(batch[0], batch[1], batch[2])
    torch.cuda.synchronize()
    diffs = [(x.int() - y.int()).abs().max().item() for x, y in zip(a, b, strict=True)]
    shapes = all(x.shape == y.shape for x, y in zip(a, b, strict=True))
    print(json.dumps({"check": hw.name, "same_shapes": shapes, "max_abs_diff": max(diffs),
                      "mean_of_max_diffs": round(sum(diffs) / len(diffs), 2)}), flush=True)


def trace(path: str, variant: str, source, step) -> None:
    """Six steps of a decode+train variant under the profiler, for a timeline of both streams;
    prints the GPU work that is not the model's (the decoder's kernels, copies) by name."""
    from torch.profiler import ProfilerActivity, profile

    it = iter(source(variant, 14))
    for _ in range(8):
        step(*next(it))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(6):
            step(*next(it))
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    it.close()
    rows = [(e.key, e.count, round(e.self_device_time_total / 1000, 2))
            for e in prof.key_averages() if e.self_device_time_total > 0]
    rows.sort(key=lambda r: -r[2])
    print(json.dumps({"trace": variant, "gpu_ms_by_name_top30": rows[:30]}), flush=True)


if __name__ == "__main__":
    main()
