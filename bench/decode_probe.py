"""The GPU decode path without training: img/s of decode + crop + resize + normalise for each
codec, on one GPU, from batches already in pinned memory (the ceiling each lever allows).

python bench/decode_probe.py /data/jpeg --batches 20 --batch-size 256
python bench/decode_probe.py /data/jpeg --loader 4 8 14   (the DataLoader alone, then with the
    decode thread on top, for each worker count: where the pipeline's ceiling is)
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torchvision import datasets

from bench.ticker import Ticker
from trainer.pipeline.gpudecode import Decoder, JpegFiles, TorchvisionCodec, collate
from trainer.pipeline.nvdecode import NvImageCodec
from trainer.pipeline.prefetch import Normalize

CODECS = ["torchvision", "nvimgcodec:hw", "nvimgcodec:hw,whole", "nvimgcodec:all",
          "nvimgcodec:all,whole", "nvimgcodec:hybrid", "nvimgcodec:gpu", "nvimgcodec:hw,gpu"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--codecs", nargs="+", default=CODECS)
    ap.add_argument("--loader", nargs="+", type=int, default=[], help="worker counts")
    ap.add_argument("--gil", action="store_true",
                    help="also: how long a thread beside the decoding one waits for the GIL")
    args = ap.parse_args()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    if args.loader:
        return loaders(args.root, args.loader, args.batch_size, args.batches, device)
    samples = datasets.ImageFolder(args.root).samples
    files = JpegFiles(samples, 224, train=True, seed=0)
    batches = [collate([files[(0, b * args.batch_size + i)] for i in range(args.batch_size)])
               for b in range(args.batches)]
    batches = [(b[0].pin_memory(), *b[1:]) for b in batches]
    normalize = Normalize(3, device, channels_last=True)
    for name in args.codecs:
        kind, _, tuning = name.partition(":")
        try:
            codec = TorchvisionCodec(device) if kind == "torchvision" else NvImageCodec(device, tuning)
        except RuntimeError as e:
            print(json.dumps({"codec": name, "error": str(e)}), flush=True)
            continue
        failed = []
        decode = Decoder(device, 224, normalize, codec, undecodable=failed.append)
        for batch in batches[:3]:  # warm-up: allocations, codec state
            decode(batch)
        torch.cuda.synchronize()
        ticker = Ticker() if args.gil else None
        t = time.perf_counter()
        for batch in batches:
            decode(batch)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        rate = len(batches) * args.batch_size / seconds
        gil = {}
        if ticker:
            ticker.stop()
            gil = {"gil_held_share": round(ticker.waited / seconds, 3),
                   "longest_gil_wait_ms": round(1000 * ticker.longest, 1)}
        print(json.dumps({"codec": codec.name, "img_s": round(rate), "undecodable": len(failed),
                          **gil,
                          "max_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}),
              flush=True)
        torch.cuda.reset_peak_memory_stats()
        del decode, codec


def loaders(root: str, workers: list[int], batch_size: int, batches: int,
            device: torch.device) -> None:
    from trainer.config import RunConfig
    from trainer.pipeline.datasets import build_datasets, build_train_loader
    from trainer.pipeline.gpudecode import choose_codec
    from trainer.pipeline.prefetch import threaded_batches
    from trainer.pipeline.sampler import ShardedBatchSampler

    bundle = build_datasets(RunConfig(data=f"imagefolder:{root}", decode="gpu"), print)
    decode = Decoder(device, 224, Normalize(3, device, True), choose_codec(device), print)
    for count in workers:
        for stage in ("loader", "loader + decode thread"):
            sampler = ShardedBatchSampler(bundle.num_train, batch_size, 0, 1,
                                          max_steps=batches + 5)
            loader = build_train_loader(bundle, sampler, count, cuda=True)
            it = iter(loader) if stage == "loader" else threaded_batches(loader, device, decode)
            for _ in range(5):
                next(it)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(batches):
                next(it)
            torch.cuda.synchronize()
            rate = batches * batch_size / (time.perf_counter() - t)
            print(json.dumps({"workers": count, "stage": stage, "codec": decode.codec.name,
                              "img_s": round(rate)}), flush=True)
            if hasattr(it, "close"):
                it.close()  # ends the decode thread
            del it, loader


if __name__ == "__main__":
    main()
