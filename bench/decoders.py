"""Decoders side by side on one GPU, batches of JPEGs held in memory: whether a second decoder
beside the first decodes more, alone and while the GPU trains (resnet18 on synthetic batches in
the main thread, as a rank would).

python bench/decoders.py /tmp/jpeg --seconds 8 [--train]
Variants: tv (torchvision's decode_jpeg, one decoder a process), nv (nvImageCodec on the JPEG
engines: pip install nvidia-nvimgcodec-cu13), nv+nv (two of them, a thread and a stream each),
tv+nv. Prints a JSON line per variant: img/s decoded by each thread, and training's img/s.
"""

from __future__ import annotations

import argparse
import glob
import json
import threading
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--train", action="store_true", help="resnet18 trains meanwhile")
    ap.add_argument("--variants", nargs="+", default=["tv", "nv", "nv+nv", "tv+nv"])
    args = ap.parse_args()
    files = sorted(glob.glob(f"{args.root}/**/*.jpg", recursive=True))[:args.images]
    data = [open(f, "rb").read() for f in files]
    batches = [data[i:i + args.batch_size] for i in range(0, len(data), args.batch_size)]
    for variant in args.variants:
        print(json.dumps(run(variant, batches, args.seconds, args.train)), flush=True)


def run(variant: str, batches: list, seconds: float, train: bool) -> dict:
    device = torch.device("cuda", 0)
    decoders = [_decoder(kind, device) for kind in variant.split("+")]
    for d in decoders:
        d(batches[0])  # set-up outside the timing
    torch.cuda.synchronize()
    stop, counts = threading.Event(), [0] * len(decoders)

    def loop(i: int) -> None:
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            n = 0
            while not stop.is_set():
                counts[i] += len(decoders[i](batches[n % len(batches)]))
                n += 1
            stream.synchronize()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(decoders))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    trained = _train(device, seconds) if train else time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    spent = time.perf_counter() - t0
    return {"variant": variant, "train": train, "img_s": [round(c / spent) for c in counts],
            "total": round(sum(counts) / spent), "train_img_s": trained}


def _decoder(kind: str, device: torch.device):
    if kind == "tv":
        from torchvision.io import ImageReadMode, decode_jpeg

        def tv(batch: list) -> list:
            data = [torch.frombuffer(b, dtype=torch.uint8) for b in batch]
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        return tv
    from nvidia import nvimgcodec as nv

    decoder = nv.Decoder(device_id=device.index, backends=[nv.Backend(nv.BackendKind.HW_GPU_ONLY)])
    params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
                             sample_format=nv.SampleFormat.I_RGB)

    def nvdecode(batch: list) -> list:
        stream = torch.cuda.current_stream(device).cuda_stream
        images = decoder.decode([nv.CodeStream(b) for b in batch], params=params,
                                cuda_stream=stream)
        return [torch.from_dlpack(i) for i in images if i is not None]
    return nvdecode


def _train(device: torch.device, seconds: float) -> int:
    import torchvision

    model = torchvision.models.resnet18().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device=device)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if steps % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return round(steps * 256 / (time.perf_counter() - t0))


if __name__ == "__main__":
    main()
