"""The run configuration, by section: each field declares its command-line option beside it
(parser.py), so `python -m ddptui_trainer` and `ddptui run` generate their parsers from here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from ddptui.contract.options.argtypes import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from ddptui.contract.options.parser import option

DATA_KINDS = ("shapes", "synthetic", "imagefolder", "cifar10", "mnist", "fashion-mnist")
# Default training resolution per data kind: the built-in and classic sets are small, so a CPU
# run shows learning in seconds; real ImageFolders and compute benchmarks use the ImageNet size.
DEFAULT_IMAGE_SIZE = {
    "shapes": 64,
    "synthetic": 224,
    "imagefolder": 224,
    "cifar10": 32,
    "mnist": 28,
    "fashion-mnist": 28,
}


BAD_SAMPLES_FLOOR = 10  # --max-bad-samples' default on a small set


@dataclass(frozen=True)
class ModelOptions:
    """The network and the numbers it computes in."""

    GROUP = "model"
    name: str = option("resnet18", "torchvision model name (resnet18, ...) or pkg.module:function",
                       flag="model")
    amp: str = option("off", choices=("bf16", "fp16", "off"))
    channels_last: bool = option(False, action="store_true")
    sync_bn: bool = option(False, action="store_true")
    cudnn_benchmark: bool = option(True, "let cuDNN autotune convolutions",
                                   action=argparse.BooleanOptionalAction)


@dataclass(frozen=True)
class DataOptions:
    """What the ranks read and how it reaches the GPU; prefetch and workers also switch live."""

    GROUP = "data"
    spec: str = option(
        "shapes", "shapes (default, generated JPEGs), synthetic, imagefolder:PATH, cifar10:PATH, "
        "mnist:PATH, fashion-mnist:PATH, or pkg.module:function returning a Dataset",
        flag="--data", metavar="SPEC")
    image_size: int | None = option(
        None, "training resolution (default: 64 shapes, 32 cifar10, 28 mnist, else 224)",
        type=positive_int, metavar="PX")
    workers: int | None = option(
        None, "DataLoader workers per rank (default: a share of the host's cores)",
        type=non_negative_int, metavar="N")
    decode: str = option(
        "cpu", "gpu: workers only read JPEG bytes; each rank decodes its batch with nvJPEG and "
        "crops/resizes/flips on the GPU (imagefolder and shapes data)", choices=("cpu", "gpu"))
    prefetch: bool = option(True, "CUDA side-stream prefetcher with on-GPU normalisation",
                            action=argparse.BooleanOptionalAction)
    max_bad_samples: int | None = option(
        None, "corrupt or unreadable samples are skipped and counted; past N distinct ones the "
        "run ends with exit 2 (default: 0.1%% of the training set, at least 10; 0: fail at the "
        "first)", type=non_negative_int, metavar="N")

    @property
    def kind(self) -> str:
        """shapes, synthetic, imagefolder, ... or custom (a pkg.module:function)."""
        kind = self.spec.split(":", 1)[0]
        return kind if kind in DATA_KINDS else "custom"

    @property
    def path(self) -> str | None:
        return self.spec.split(":", 1)[1] if ":" in self.spec and self.kind != "custom" else None

    @property
    def jpeg_files(self) -> bool:
        """Image files a rank decodes (what --decode gpu takes): the built-in shapes and JPEG
        ImageFolders."""
        return self.kind in ("imagefolder", "shapes")

    @property
    def resolved_image_size(self) -> int:
        return self.image_size or DEFAULT_IMAGE_SIZE.get(self.kind, 224)

    def resolved_workers(self, world_size: int) -> int:
        """DataLoader workers per rank: the explicit value, else the rank's share of the host's
        cores less one, at most 12 (more decoding workers train faster up to there:
        docs/benchmarks.md, the input pipeline)."""
        if self.workers is not None:
            return self.workers
        share = (os.cpu_count() or 2) // max(1, world_size)
        return max(1, min(12, share - 1))

    def bad_sample_limit(self, num_train: int) -> int:
        """Distinct corrupt samples a run skips before it ends with exit 2."""
        if self.max_bad_samples is not None:
            return self.max_bad_samples
        return max(BAD_SAMPLES_FLOOR, num_train // 1000)  # one bad file in 200 is no reason to stop


@dataclass(frozen=True)
class TrainOptions:
    """How long and how the run optimises."""

    GROUP = "training"
    epochs: int = option(5, type=positive_int, metavar="N")
    steps_per_epoch: int | None = option(None, "cap on optimizer steps per epoch",
                                         type=positive_int, metavar="N")
    batch_size: int = option(32, "per rank", type=positive_int, metavar="N")
    optimizer: str = option("sgd", "sgd: Nesterov momentum; adamw: fused AdamW on CUDA",
                            choices=("sgd", "adamw"))
    lr: float | None = option(None, "default 0.05 with sgd, 1e-3 with adamw",
                              type=positive_float)
    lr_scaling: str = option("none", "linear: lr x world size (Goyal et al.)",
                             choices=("none", "linear"))
    momentum: float = 0.9
    weight_decay: float = 5e-5
    seed: int = option(0, type=non_negative_int)
    deterministic: bool = option(
        False, "cudnn.deterministic, no benchmark, per-sample seeded augmentation",
        action="store_true")


@dataclass(frozen=True)
class CheckpointOptions:
    """Checkpoints on disk and the rollback points in host memory."""

    GROUP = "checkpoints"
    dir: str | None = option(None, flag="--checkpoint-dir", metavar="DIR")
    every: int = option(0, "also checkpoint every N steps (default: each epoch only)",
                        flag="--checkpoint-every", type=non_negative_int, metavar="STEPS")
    # None: a fresh start; "auto": the newest good checkpoint in dir; else a file.
    resume: str | None = option(
        None, "continue from the newest good checkpoint in --checkpoint-dir, or FILE",
        nargs="?", const="auto", metavar="FILE")
    snapshot_every: int = option(
        8, "under ddptui run: steps between host-memory rollback points; after a rank dies the "
        "others go back at most this far and carry on (0: a dead rank ends the run)",
        type=non_negative_int, metavar="STEPS")


@dataclass(frozen=True)
class TelemetryOptions:
    """Where the ranks' events go."""

    GROUP = "telemetry"
    log: str | None = option(None, "telemetry log", metavar="FILE.jsonl")
    hz: float = option(
        4.0, "step events a second per rank (0: none, and no GPU sampling: for measuring what "
        "telemetry costs)", flag="--telemetry-hz", type=non_negative_float, metavar="HZ")
    tensorboard: str | None = option(
        None, "also write the scalars for TensorBoard (needs the tensorboard package)",
        metavar="DIR")
    report: str | None = option(
        None, "under torchrun or srun: send telemetry to `ddptui attach` there and take its "
        "commands (also $DDPTUI_REPORT; key: $DDPTUI_AUTHKEY or the key file attach prints)",
        metavar="HOST:PORT")


@dataclass(frozen=True)
class DeviceOptions:
    """Where the ranks run (ddptui run; a torchrun launch takes it from the environment)."""

    GROUP = "launch"
    gpus: tuple[int, ...] | None = option(
        None, "GPU indices in nvidia-smi order (0,1) or 'all' (default: all GPUs)",
        metavar="LIST")
    cpus: int | None = option(None, "N CPU ranks on gloo (default 2 where there is no GPU)",
                              type=positive_int, metavar="N")
    strategy: str = option(
        "ddp", "dp: one process driving every chosen GPU with torch.nn.DataParallel (to see the "
        "difference DDP makes; --batch-size stays per GPU)", choices=("ddp", "dp"))

    @property
    def world_size(self) -> int:
        if self.strategy == "dp":
            return 1
        return len(self.gpus) if self.gpus else (self.cpus or 2)

    @property
    def kind(self) -> str:
        return "cuda" if self.gpus else "cpu"


TRAINING_SECTIONS = (ModelOptions, DataOptions, TrainOptions, CheckpointOptions, TelemetryOptions)


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs, by section; built once by the CLI and passed down to every rank.
    How ddptui handles crashes and stalls is its own: ddptui/contract/options/policy.py."""

    model: ModelOptions = field(default_factory=ModelOptions)
    data: DataOptions = field(default_factory=DataOptions)
    train: TrainOptions = field(default_factory=TrainOptions)
    checkpoint: CheckpointOptions = field(default_factory=CheckpointOptions)
    telemetry: TelemetryOptions = field(default_factory=TelemetryOptions)
    devices: DeviceOptions = field(default_factory=DeviceOptions)

    def settings(self, world_size: int) -> dict:
        """The live-switchable settings, as shown in the dashboard and the `epoch` events."""
        return {
            "prefetch": self.data.prefetch,
            "workers": self.data.resolved_workers(world_size),
            "cudnn_benchmark": self.model.cudnn_benchmark,
        }

    def replace(self, **changes) -> RunConfig:
        """A copy with fields changed by name, whichever section holds them (names are unique
        across sections): config.replace(batch_size=64, cudnn_benchmark=False)."""
        sections: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            section = _SECTION_OF.get(name)
            if section is None:
                raise TypeError(f"RunConfig has no field {name!r}")
            sections.setdefault(section, {})[name] = value
        return dataclasses.replace(self, **{
            s: dataclasses.replace(getattr(self, s), **fields) for s, fields in sections.items()})


_SECTION_OF = {f.name: s.name for s in dataclasses.fields(RunConfig)  # every section has a factory
               for f in dataclasses.fields(s.default_factory())}  # type: ignore[misc,operator]
