"""Why GPU JPEG decode and training do not overlap on one GPU (issue 14 part 1): resnet18 (bf16,
channels_last, bs 256) trained from a decode thread, in variants that each take one suspect away.

python bench/overlap_probe.py /tmp/jpeg --steps 40 [--variants ...] [--trace DIR]
Each variant prints img/s, the GPU time of a training step (CUDA events around it) and the gap
between steps (time the compute stream had nothing of the step's to run).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision.models import resnet18

from trainer.pipeline.forkserver import worker_context
from trainer.pipeline.gpudecode import Decoder, JpegFiles, TorchvisionCodec, collate
from trainer.pipeline.nvjpeg import HardwareJpeg
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
                         "CODEC:WHAT[:hp|:dl|:cpuNN|:nopin|:aff] with CODEC tv|hwN (N lanes), "
                         "WHAT decode, decode+train, decode+graph, rawdecode+train; hp: a "
                         "high-priority decode stream; dl: batches from a DataLoader reading the "
                         "files (nopin: not pinned; aff: the probe's threads on two whole "
                         "cores, the workers on the rest); cpuNN: NN%% of each batch arrives "
                         "decoded, as CPU workers would send it")
    ap.add_argument("--workers", type=int, default=8, help="DataLoader workers for :dl variants")
    ap.add_argument("--trace", help="write a torch.profiler trace of tv:decode+train here")
    args = ap.parse_args()
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
    check(codecs["hw4"], tv, jpegs[0])
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
        if what.startswith("rawdecode"):
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

    for variant in args.variants:
        warm, n = 8, args.steps
        train = "train" in variant or "graph" in variant
        run = graph_step if "graph" in variant else step
        it = iter(source(variant, warm + n))
        for _ in range(warm):
            images, labels = next(it)
            if train:
                run(images, labels)
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
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        gpu = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        gaps = [ends[i - 1].elapsed_time(starts[i]) for i in range(1, n)]
        print(json.dumps({
            "variant": variant, "img_s": round(n * bs / seconds),
            "step_gpu_ms_median": round(statistics.median(gpu), 2),
            "gap_ms_median": round(statistics.median(gaps), 2),
            "host_wait_for_batch_ms_per_step": round(1000 * waited / n, 2),
            "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}), flush=True)
        if hasattr(it, "close"):
            it.close()
    if args.trace:
        trace(args.trace, source, step)


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


def trace(path: str, source, step) -> None:
    """Six steps of decode+train under the profiler, for a timeline of both streams."""
    from torch.profiler import ProfilerActivity, profile

    it = iter(source("tv:decode+train", 14))
    for _ in range(8):
        step(*next(it))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(6):
            step(*next(it))
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    it.close()


if __name__ == "__main__":
    main()
