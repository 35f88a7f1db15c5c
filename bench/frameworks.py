"""What ddptui's framework callbacks cost: resnet18 (bf16, channels_last, synthetic batches on
the GPU) under Lightning and the Hugging Face Trainer, with and without DdptuiCallback, each
under `ddptui run --headless`, alternating; prints a markdown table of the img/s each script
measured itself (rank 0, a timed window after the warm-up) and the ratio with/without.

python bench/frameworks.py --gpus 1 --rounds 3 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 256


class Window:
    """Times steps warmup..warmup+steps on the GPU (synchronised at both ends, nowhere else)."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps, self.seen, self.t0 = warmup, steps, 0, 0.0
        self.img_s: float | None = None

    def step(self) -> None:
        self.seen += 1
        if self.seen == self.warmup:
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()
        elif self.seen == self.warmup + self.steps:
            torch.cuda.synchronize()
            world = int(os.environ.get("WORLD_SIZE", 1))
            self.img_s = self.steps * BATCH * world / (time.perf_counter() - self.t0)
            if int(os.environ.get("RANK", 0)) == 0:
                print("BENCH " + json.dumps({"img_s": self.img_s}), flush=True)


def synthetic(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(BATCH, 3, 224, 224, device=device).contiguous(
        memory_format=torch.channels_last)
    return x, torch.randint(0, 1000, (BATCH,), device=device)


def run_lightning(args) -> None:
    import lightning as L
    import torch.nn.functional as F
    import torchvision

    from ddptui.integrations.lightning import DdptuiCallback

    window = Window(args.warmup, args.steps)

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet18().to(memory_format=torch.channels_last)

        def training_step(self, batch, batch_idx):
            if not hasattr(self, "xy"):
                self.xy = synthetic(self.device)
            return F.cross_entropy(self.net(self.xy[0]), self.xy[1])

        def on_train_batch_end(self, outputs, batch, batch_idx):
            window.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    steps = args.warmup + args.steps
    trainer = L.Trainer(accelerator="gpu", devices=int(os.environ.get("WORLD_SIZE", 1)),
                        strategy="ddp", precision="bf16-mixed", max_steps=steps, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False,
                        callbacks=[DdptuiCallback()] if args.callback else [])
    # One long epoch, as a real one is (an epoch's end costs a sync and a row).
    trainer.fit(Net(), torch.utils.data.DataLoader(range(steps * BATCH * 2), batch_size=BATCH))


def run_transformers(args) -> None:
    import torch.nn.functional as F
    import torchvision
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from ddptui.integrations.transformers import DdptuiCallback

    window = Window(args.warmup, args.steps)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet18().to(memory_format=torch.channels_last)

        def forward(self, i):
            if not hasattr(self, "xy"):
                self.xy = synthetic(i.device)
            return {"loss": F.cross_entropy(self.net(self.xy[0]), self.xy[1])}

    class Timed(TrainerCallback):
        def on_step_end(self, *a, **k):
            window.step()

    class Indices(torch.utils.data.Dataset):
        def __len__(self):
            return (args.warmup + args.steps) * BATCH * 2

        def __getitem__(self, i):
            return {"i": i}

    training = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=args.warmup + args.steps,
                                 per_device_train_batch_size=BATCH, bf16=True, report_to=[],
                                 save_strategy="no", logging_steps=50, disable_tqdm=True,
                                 dataloader_num_workers=2)
    callbacks = [Timed()] + ([DdptuiCallback()] if args.callback else [])
    Trainer(model=Net(), args=training, train_dataset=Indices(), callbacks=callbacks).train()


def measure(framework: str, callback: bool, args) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "ddptui", "run", os.path.abspath(__file__), "--gpus",
               ",".join(map(str, range(args.gpus))), "--headless", "--log",
               os.path.join(tmp, "run.jsonl"), "--", "--rank-side", framework, "--warmup",
               str(args.warmup), "--steps", str(args.steps)] + (["--callback"] if callback else [])
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=dict(
            os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get(
                "PYTHONPATH")) if p)))
        if out.returncode != 0:
            raise SystemExit(f"{framework} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")][-1]
        return json.loads(line.removeprefix("BENCH "))["img_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--frameworks", nargs="+", default=["lightning", "transformers"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rank-side", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--callback", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_side:  # one rank of one variant, started by measure() under ddptui run
        {"lightning": run_lightning, "transformers": run_transformers}[args.rank_side](args)
        return
    rates = {f"{f} {c}": [] for f in args.frameworks for c in ("without", "with")}
    for r in range(args.rounds):
        for f in args.frameworks:
            for callback in ((False, True) if r % 2 == 0 else (True, False)):
                key = f"{f} {'with' if callback else 'without'}"
                rates[key].append(measure(f, callback, args))
                print(f"round {r} {key}: {rates[key][-1]:,.0f} img/s", flush=True)
    print("\n| framework | callback | img/s (each round) | mean | with / without |\n|---|---|---|---|---|")
    for f in args.frameworks:
        base = statistics.mean(rates[f"{f} without"])
        for c in ("without", "with"):
            mean = statistics.mean(rates[f"{f} {c}"])
            print(f"| {f} | {c} | {', '.join(f'{x:,.0f}' for x in rates[f'{f} {c}'])} | "
                  f"{mean:,.0f} | {mean / base:.4f} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rates, fh, indent=1)


if __name__ == "__main__":
    main()
