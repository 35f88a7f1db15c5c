"""The run configuration and the one options parser shared by `python -m trainer` and `ddptui run`.

Nothing here imports torch: the dashboard parses and validates options before any rank exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass

from trainer.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from trainer.model_names import TORCHVISION_CLASSIFIERS

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


class UsageError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2."""


class DataError(Exception):
    """A data problem the user must fix (corrupt image, bad dataset function); exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr (no usage dump) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs; built once by the CLI and passed down to every rank."""

    model: str = "resnet18"
    data: str = "shapes"
    epochs: int = 5
    steps_per_epoch: int | None = None
    batch_size: int = 32
    lr: float | None = None  # None: 0.05 for SGD, 1e-3 for AdamW
    optimizer: str = "sgd"
    lr_scaling: str = "none"
    momentum: float = 0.9
    weight_decay: float = 5e-5
    image_size: int | None = None
    workers: int | None = None
    decode: str = "cpu"
    prefetch: bool = True
    cudnn_benchmark: bool = True
    amp: str = "off"
    channels_last: bool = False
    sync_bn: bool = False
    seed: int = 0
    deterministic: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: str | None = None  # None: fresh start; "auto": newest good checkpoint; else a file
    log: str | None = None
    telemetry_hz: float = 4.0
    snapshot_every: int = 8  # steps between rollback points (crash recovery)
    tensorboard: str | None = None
    report: str | None = None  # HOST:PORT of a `ddptui attach` (ranks started by torchrun/srun)
    # The devices (ddptui run only; a torchrun launch takes them from the environment). How
    # ddptui handles crashes and stalls is its own: ddptui/run/policy.py.
    gpus: tuple[int, ...] | None = None
    cpus: int | None = None
    strategy: str = "ddp"  # dp: one process, torch.nn.DataParallel across the chosen GPUs
    max_bad_samples: int | None = None  # None: 0.1% of the training set, at least 10

    def bad_sample_limit(self, num_train: int) -> int:
        """Distinct corrupt samples a run skips before it ends with exit 2."""
        if self.max_bad_samples is not None:
            return self.max_bad_samples
        return max(BAD_SAMPLES_FLOOR, num_train // 1000)  # one bad file in 200 is no reason to stop

    @property
    def data_kind(self) -> str:
        return self.data.split(":", 1)[0] if self.data.split(":", 1)[0] in DATA_KINDS else "custom"

    @property
    def data_path(self) -> str | None:
        return self.data.split(":", 1)[1] if ":" in self.data and self.data_kind != "custom" else None

    @property
    def resolved_image_size(self) -> int:
        return self.image_size or DEFAULT_IMAGE_SIZE.get(self.data_kind, 224)

    @property
    def world_size(self) -> int:
        if self.strategy == "dp":
            return 1
        return len(self.gpus) if self.gpus else (self.cpus or 2)

    @property
    def device_kind(self) -> str:
        return "cuda" if self.gpus else "cpu"

    def resolved_workers(self, world_size: int) -> int:
        """DataLoader workers per rank: the explicit value, else the rank's share of the host's
        cores less one, at most 12 (on 2 x H200 with 16 cores each, --decode cpu trained 1.65x
        faster with 12 than with 8; --decode gpu alike with 6 or 12)."""
        if self.workers is not None:
            return self.workers
        share = (os.cpu_count() or 2) // max(1, world_size)
        return max(1, min(12, share - 1))

    def settings(self, world_size: int) -> dict:
        """The live-switchable settings, as shown in the dashboard and the `epoch` events."""
        return {
            "prefetch": self.prefetch,
            "workers": self.resolved_workers(world_size),
            "cudnn_benchmark": self.cudnn_benchmark,
        }

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """The training options that both launchers accept (ddptui run and python -m trainer)."""
    d = RunConfig()
    parser.add_argument("model", help="torchvision model name (resnet18, ...) or pkg.module:function")
    g = parser.add_argument_group("data")
    g.add_argument(
        "--data",
        default=d.data,
        metavar="SPEC",
        help="shapes (default, generated JPEGs), synthetic, imagefolder:PATH, cifar10:PATH, "
        "mnist:PATH, fashion-mnist:PATH, or pkg.module:function returning a Dataset",
    )
    g.add_argument("--image-size", type=positive_int, default=None, metavar="PX",
                   help="training resolution (default: 64 shapes, 32 cifar10, 28 mnist, else 224)")
    g.add_argument("--workers", type=non_negative_int, default=None, metavar="N",
                   help="DataLoader workers per rank (default: a share of the host's cores)")
    g.add_argument("--decode", choices=("cpu", "gpu"), default=d.decode,
                   help="gpu: workers only read JPEG bytes; each rank decodes its batch with "
                   "nvJPEG and crops/resizes/flips on the GPU (imagefolder and shapes data)")
    g.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=d.prefetch,
                   help="CUDA side-stream prefetcher with on-GPU normalisation")
    g.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction,
                   default=d.cudnn_benchmark, help="let cuDNN autotune convolutions")
    _schedule_and_numerics(parser.add_argument_group("schedule"), parser, d)
    _state_and_output(parser.add_argument_group("state and output"), d)


def _schedule_and_numerics(g, parser: argparse.ArgumentParser, d: RunConfig) -> None:
    """How long and how the run trains."""
    g.add_argument("--epochs", type=positive_int, default=d.epochs, metavar="N")
    g.add_argument("--steps-per-epoch", type=positive_int, default=None, metavar="N",
                   help="cap on optimizer steps per epoch")
    g.add_argument("--batch-size", type=positive_int, default=d.batch_size, metavar="N",
                   help="per rank")
    g.add_argument("--optimizer", choices=("sgd", "adamw"), default=d.optimizer,
                   help="sgd: Nesterov momentum; adamw: fused AdamW on CUDA")
    g.add_argument("--lr", type=positive_float, default=d.lr,
                   help="default 0.05 with sgd, 1e-3 with adamw")
    g.add_argument("--lr-scaling", choices=("none", "linear"), default=d.lr_scaling,
                   help="linear: lr x world size (Goyal et al.)")
    g = parser.add_argument_group("numerics")
    g.add_argument("--amp", choices=("bf16", "fp16", "off"), default=d.amp)
    g.add_argument("--channels-last", action="store_true")
    g.add_argument("--sync-bn", action="store_true")
    g.add_argument("--seed", type=non_negative_int, default=d.seed)
    g.add_argument("--deterministic", action="store_true",
                   help="cudnn.deterministic, no benchmark, per-sample seeded augmentation")


def _state_and_output(g, d: RunConfig) -> None:
    """Checkpoints, logs and where telemetry goes."""
    g.add_argument("--checkpoint-dir", default=None, metavar="DIR")
    g.add_argument("--checkpoint-every", type=non_negative_int, default=0, metavar="STEPS",
                   help="also checkpoint every N steps (default: each epoch only)")
    g.add_argument("--resume", nargs="?", const="auto", default=None, metavar="FILE",
                   help="continue from the newest good checkpoint in --checkpoint-dir, or FILE")
    g.add_argument("--log", default=None, metavar="FILE.jsonl", help="telemetry log")
    g.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="also write the scalars for TensorBoard (needs the tensorboard package)")
    g.add_argument("--report", default=None,
                   metavar="HOST:PORT", help="under torchrun or srun: send telemetry to `ddptui "
                   "attach` there and take its commands (also $DDPTUI_REPORT; key: "
                   "$DDPTUI_AUTHKEY or the key file attach prints)")
    g.add_argument("--telemetry-hz", type=non_negative_float, default=d.telemetry_hz,
                   metavar="HZ", help="step events a second per rank (0: none, and no GPU "
                   "sampling: for measuring what telemetry costs)")
    g.add_argument("--max-bad-samples", type=non_negative_int, default=None, metavar="N",
                   help="corrupt or unreadable samples are skipped and counted; past N distinct "
                   "ones the run ends with exit 2 (default: 0.1%% of the training set, at least "
                   "10; 0: fail at the first)")
    g.add_argument("--snapshot-every", type=non_negative_int, default=d.snapshot_every,
                   metavar="STEPS", help="under ddptui run: steps between host-memory rollback "
                   "points; after a rank dies the others go back at most this far and carry on "
                   "(0: a dead rank ends the run)")


def config_from_args(args: argparse.Namespace, **launch) -> RunConfig:
    """Build and validate a RunConfig; raises UsageError with a one-line message."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    values.update(launch)
    config = RunConfig(**values)
    validate(config)
    if config.deterministic:
        # deterministic wins: autotuning picks kernels nondeterministically.
        config = config.replace(cudnn_benchmark=False)
    if config.strategy == "dp":
        # DataParallel runs each replica in a new thread every step, and cuDNN's autotuning
        # starts over in each: measured 640 vs 7,065 img/s (resnet18, 2 x H200).
        config = config.replace(cudnn_benchmark=False)
    return config


def validate(config: RunConfig) -> None:
    """Checks that need no torch and start no process: names, paths, directories."""
    check_model_name(config.model)
    check_data(config.data)
    if config.decode == "gpu" and config.data_kind not in ("imagefolder", "shapes"):
        raise UsageError("--decode gpu works on JPEG image folders: --data imagefolder:PATH "
                         "or shapes")
    if config.resume and not config.checkpoint_dir and config.resume == "auto":
        raise UsageError("--resume needs --checkpoint-dir (or a checkpoint FILE)")
    if config.resume and config.resume != "auto" and not os.path.isfile(config.resume):
        raise UsageError(f"checkpoint not found: {config.resume}")
    if config.checkpoint_dir:
        check_writable_dir(config.checkpoint_dir, "--checkpoint-dir")
    if config.log:
        check_writable_dir(os.path.dirname(os.path.abspath(config.log)), "--log directory")
    if config.tensorboard:
        if importlib.util.find_spec("tensorboard") is None:
            raise UsageError("--tensorboard needs the tensorboard package: "
                             "pip install tensorboard (or ddptui[tensorboard])")
        check_writable_dir(config.tensorboard, "--tensorboard directory")
    if config.report:
        from trainer.protocol.channel import load_key, parse_address

        try:
            parse_address(config.report, "--report")
            load_key()
        except ValueError as e:  # NoKey included
            raise UsageError(str(e)) from None


def check_model_name(name: str) -> None:
    if ":" in name:
        _check_import_spec(name, "model")
        return
    if name in TORCHVISION_CLASSIFIERS:
        return
    # A newer torchvision may know more names than our list; only then pay for importing it.
    try:
        import torchvision.models

        known = torchvision.models.list_models(module=torchvision.models)
    except Exception:
        known = TORCHVISION_CLASSIFIERS
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else " (try resnet18, resnet50, vit_b_16)"
    raise UsageError(f"unknown model {name!r}{hint}")


def check_data(spec: str) -> None:
    kind, _, path = spec.partition(":")
    if kind in ("shapes", "synthetic"):
        if path:
            raise UsageError(f"--data {kind} takes no path")
        return
    if kind not in DATA_KINDS:
        if ":" in spec and path.isidentifier():
            _check_import_spec(spec, "data")
            return
        raise UsageError(f"unknown --data {spec!r}: use one of {', '.join(DATA_KINDS)} "
                         "(with :PATH where needed) or pkg.module:function")
    if not path:
        raise UsageError(f"--data {kind} needs a path: {kind}:PATH")
    if not os.path.isdir(path):
        raise UsageError(f"data path not found: {path}")
    missing = missing_dataset_files(kind, path)
    if missing:
        raise UsageError(f"{kind} files missing under {path}: {', '.join(missing)}")


def missing_dataset_files(kind: str, root: str) -> list[str]:
    """The files torchvision's on-disk format needs that are not there (never downloaded)."""
    if kind == "imagefolder":
        train = os.path.join(root, "train")
        base = train if os.path.isdir(train) else root
        classes = [e for e in os.scandir(base) if e.is_dir()] if os.path.isdir(base) else []
        return [] if classes else [f"{base}/<class>/<image> folders"]
    if kind == "cifar10":
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
        return [f"cifar-10-batches-py/{n}" for n in names
                if not os.path.isfile(os.path.join(root, "cifar-10-batches-py", n))]
    if kind in ("mnist", "fashion-mnist"):
        folder = "MNIST" if kind == "mnist" else "FashionMNIST"
        names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
        return [f"{folder}/raw/{n}" for n in names
                if not os.path.isfile(os.path.join(root, folder, "raw", n))]
    return []


def _check_import_spec(spec: str, what: str) -> None:
    module, _, func = spec.partition(":")
    if not module or not func or not func.isidentifier():
        raise UsageError(f"bad {what} {spec!r}: expected pkg.module:function")
    # find_spec locates the module without running it, so a user module that imports torch
    # does not slow the dashboard's start.
    importable_from_cwd()
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UsageError(f"{what} module not found: {module} (from {spec})")


def importable_from_cwd() -> None:
    """User `pkg.module:function` specs resolve from the working directory, as with `python -m`."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def check_writable_dir(path: str, what: str) -> None:
    """Create the directory if needed and prove a file can be written there."""
    path = path or "."
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".ddptui-probe-"):
            pass
    except OSError as e:
        raise UsageError(f"{what} is not writable: {path} ({e.strerror})") from None
