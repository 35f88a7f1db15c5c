"""From a command line to a checked RunConfig: the options generated from the config's sections,
and every check that needs no torch and starts no process (names, paths, writable directories).
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib.util
import os
import sys
import tempfile
import zipfile
from typing import Any

from ddptui.contract.options.config import (
    DATA_KINDS,
    TRAINING_SECTIONS,
    CheckpointOptions,
    DataOptions,
    DeviceOptions,
    ModelOptions,
    RunConfig,
    TelemetryOptions,
    TrainOptions,
)
from ddptui.contract.options.errors import UsageError
from ddptui.contract.options.model_names import classifier_names
from ddptui.contract.options.parser import add_sections, from_args


def add_training_options(parser: argparse.ArgumentParser, *more: type) -> dict[str, Any]:
    """The training options that both launchers accept (ddptui run and python -m ddptui_trainer), and
    the sections `more` that one of them adds; returns the argument groups by title."""
    return add_sections(parser, *TRAINING_SECTIONS, *more)


def config_from_args(args: argparse.Namespace, **devices) -> RunConfig:
    """Build and validate a RunConfig; `devices` are DeviceOptions' fields (resolved --gpus);
    raises UsageError with a one-line message."""
    config = RunConfig(model=from_args(ModelOptions, args), data=from_args(DataOptions, args),
                       train=from_args(TrainOptions, args),
                       checkpoint=from_args(CheckpointOptions, args),
                       telemetry=from_args(TelemetryOptions, args),
                       devices=from_args(DeviceOptions, args, **devices))
    validate(config)
    if config.train.deterministic:
        # deterministic wins: autotuning picks kernels nondeterministically.
        config = config.replace(cudnn_benchmark=False)
    if config.devices.strategy == "dp":
        # DataParallel runs each replica in a new thread every step, and cuDNN's autotuning
        # starts over in each, every step (docs/benchmarks.md, overhead).
        config = config.replace(cudnn_benchmark=False)
    return config


def validate(config: RunConfig) -> None:
    """Checks that need no torch and start no process: names, paths, directories."""
    check_model_name(config.model.name)
    check_data(config.data.spec)
    if config.data.decode == "gpu" and not config.data.jpeg_files:
        raise UsageError("--decode gpu works on JPEG image folders: --data imagefolder:PATH "
                         "or shapes")
    ckpt, tele = config.checkpoint, config.telemetry
    if ckpt.resume == "auto" and not ckpt.dir:
        raise UsageError("--resume needs --checkpoint-dir (or a checkpoint FILE)")
    if ckpt.resume and ckpt.resume != "auto":
        if not os.path.isfile(ckpt.resume):
            raise UsageError(f"checkpoint not found: {ckpt.resume}")
        # torch.save writes a zip archive whose directory is its last record: a truncated
        # file has none, and is refused here rather than after the ranks have imported torch.
        if not zipfile.is_zipfile(ckpt.resume):
            raise UsageError(f"cannot resume from {ckpt.resume}: unreadable (truncated or not "
                             "a checkpoint)")
    if ckpt.dir:
        check_writable_dir(ckpt.dir, "--checkpoint-dir")
    if tele.log:
        check_writable_file(tele.log, "--log")
    if tele.tensorboard:
        check_tensorboard(tele.tensorboard)
    if tele.report:
        from ddptui.contract.channel import load_key, parse_address

        try:
            parse_address(tele.report, "--report")
            load_key()
        except ValueError as e:  # NoKey included
            raise UsageError(str(e)) from None


def check_model_name(name: str) -> None:
    if ":" in name:
        _check_import_spec(name, "model")
        return
    known = classifier_names()
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


def check_tensorboard(path: str) -> None:
    """--tensorboard DIR: the package is there and DIR can be written."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError("--tensorboard needs the tensorboard package: "
                         "pip install tensorboard (or ddptui[tensorboard])")
    check_writable_dir(path, "--tensorboard directory")


def check_writable_file(path: str, what: str) -> None:
    """`what` PATH (a log) can be created or appended to; its folder is made if needed. A file
    that was there is left as it was, one made here is removed."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot make its folder {folder} ({e.strerror})") from None
    existed = os.path.exists(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    except OSError as e:
        # ENOENT for a file being created: its folder (/proc, /sys) makes no new files.
        why = f"{folder} takes no new files" if e.errno == errno.ENOENT else e.strerror
        raise UsageError(f"{what} {path}: cannot write this file ({why})") from None
    if not existed:
        os.remove(path)


def check_writable_dir(path: str, what: str) -> None:
    """Create the directory if needed and prove a file can be written there."""
    path = path or "."
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".ddptui-probe-"):
            pass
    except OSError as e:
        raise UsageError(f"{what} is not writable: {path} ({e.strerror})") from None
