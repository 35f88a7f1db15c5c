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
import statistics
import time

import torch
import torch.nn.functional as F
from torchvision import datasets
from torchvision.models import resnet18

from trainer.pipeline.gpudecode import Decoder, JpegFiles, TorchvisionCodec, collate
from trainer.pipeline.prefetch import Normalize, threaded_batches

VARIANTS = ["train", "train-side-stream", "decode", "decode+train", "decode+train-side-stream",
            "rawdecode+train", "resize+train", "decode+train"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--batches", type=int, default=16, help="distinct JPEG batches, cycled")
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--trace", help="write a torch.profiler trace of decode+train here")
    args = ap.parse_args()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    files = JpegFiles(datasets.ImageFolder(args.root).samples, 224, train=True, seed=0)
    bs = args.batch_size
    jpegs = [collate([files[(0, b * bs + i)] for i in range(bs)]) for b in range(args.batches)]
    jpegs = [(b[0].pin_memory(), *b[1:]) for b in jpegs]
    normalize = Normalize(3, device, channels_last=True)
    codec = TorchvisionCodec(device)
    decoder = Decoder(device, 224, normalize, codec, undecodable=print)
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

    decoded = None
    if "resize+train" in args.variants:
        with torch.no_grad():
            decoded = [(codec.decode(b[0], b[1], b[2]), b[2], b[3]) for b in jpegs]

    def resize_only(item):
        images, boxes, labels = item
        out = decoder._crop_and_resize(images, boxes)
        return normalize.standardize(out), labels.to(device, non_blocking=True)

    def raw_decode(batch):
        codec.decode(batch[0], batch[1], batch[2])
        return x, y

    def source(variant: str, n: int):
        if variant.startswith("train"):
            return itertools.repeat((x, y), n)
        if variant.startswith("resize"):
            items, prepare = decoded, resize_only
        else:
            items, prepare = jpegs, raw_decode if variant.startswith("rawdecode") else decoder
        return threaded_batches(itertools.islice(itertools.cycle(items), n), device, prepare)

    for variant in args.variants:
        warm, n = 8, args.steps
        side = torch.cuda.Stream(device) if variant.endswith("side-stream") else None
        train = "train" in variant
        it = iter(source(variant, warm + n))
        with torch.cuda.stream(side) if side else torch.cuda.stream(torch.cuda.current_stream()):
            for _ in range(warm):
                images, labels = next(it)
                if train:
                    step(images, labels)
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
                    step(images, labels)
                ends[i].record()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t
        gpu = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        gaps = [ends[i - 1].elapsed_time(starts[i]) for i in range(1, n)]
        print(json.dumps({
            "variant": variant, "img_s": round(n * bs / seconds),
            "step_gpu_ms_median": round(statistics.median(gpu), 2),
            "gap_ms_median": round(statistics.median(gaps), 2),
            "gap_ms_max": round(max(gaps), 2),
            "host_wait_for_batch_s": round(waited, 3),
            "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}), flush=True)
        if hasattr(it, "close"):
            it.close()
    if args.trace:
        trace(args.trace, source, step)


def trace(path: str, source, step) -> None:
    """Six steps of decode+train under the profiler, for a timeline of both streams."""
    from torch.profiler import ProfilerActivity, profile

    it = iter(source("decode+train", 14))
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
