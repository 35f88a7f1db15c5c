"""A user's `module:function` model and dataset, as a test would write them."""

import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import Dataset


def tiny_cnn(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """Small enough that a CPU step takes milliseconds."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(8 * 16, num_classes))


def paced_cnn(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """tiny_cnn whose forward first waits 20 ms, as a GPU's host does: a run a test leaves going
    while it acts (--detach's) costs the machine's two cores little."""
    net = tiny_cnn(num_classes, in_channels)
    net.register_forward_pre_hook(_wait_20_ms)
    return net


def _wait_20_ms(*_) -> None:
    time.sleep(0.02)


class Blobs(Dataset):
    """Float images whose class is the brightest quadrant: learnable in a few steps."""

    classes = ["tl", "tr", "bl", "br"]

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        self.images = torch.rand(n, 3, 16, 16, generator=g) * 0.3
        for i, label in enumerate(self.labels.tolist()):
            r, c = divmod(label, 2)
            self.images[i, :, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] += 0.7

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


def blobs():
    return Blobs(512, 0), Blobs(128, 1)


def many_blobs():
    """Epochs long enough (256 steps at batch 16) that a key lands inside one."""
    return Blobs(4096, 0), Blobs(128, 1)


class Recorder(Dataset):
    """Blobs that append `time pid index` to $DDPTUI_TEST_RECORD for every sample served (the
    exactly-once checks), and take $DDPTUI_TEST_ITEM_S seconds a sample while the file named by
    $DDPTUI_TEST_SLOW exists, so a test has time to act inside one epoch."""

    classes = Blobs.classes

    def __init__(self, n: int):
        self.inner = Blobs(n, 0)
        self.path = os.environ["DDPTUI_TEST_RECORD"]
        self.slow_flag = os.environ.get("DDPTUI_TEST_SLOW", "")
        self.delay = float(os.environ.get("DDPTUI_TEST_ITEM_S", "0"))

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        if self.delay and os.path.exists(self.slow_flag):
            time.sleep(self.delay)
        with open(self.path, "a") as f:
            f.write(f"{time.time():.6f} {os.getpid()} {i}\n")
        return self.inner[i]


def recorded():
    return Recorder(int(os.environ.get("DDPTUI_TEST_SAMPLES", "3000"))), Blobs(64, 1)


class OnceOnRank(Dataset):
    """Blobs; rank $DDPTUI_TEST_<NAME>_RANK does `act()` when it fetches item number
    $DDPTUI_TEST_<NAME>_AT (counted per process), once per run (a flag file says it did)."""

    classes = Blobs.classes
    name = ""

    def __init__(self):
        self.inner = Blobs(512, 0)
        env = f"DDPTUI_TEST_{self.name}_"
        self.at = int(os.environ[env + "AT"])
        self.flag = os.environ[env + "FLAG"]
        self.rank = int(os.environ[env + "RANK"])
        self.count = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        self.count += 1
        if self.count == self.at and torch.distributed.get_rank() == self.rank:
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                self.act()
            except FileExistsError:
                pass
        return self.inner[i]

    def act(self) -> None:
        raise NotImplementedError


class CrashOnce(OnceOnRank):
    """Kills itself with SIGKILL ($DDPTUI_TEST_CRASH_*)."""

    name = "CRASH"

    def act(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def crash_once():
    return CrashOnce(), Blobs(128, 1)


class HangOnce(OnceOnRank):
    """Blocks forever in block_forever_here() ($DDPTUI_TEST_HANG_*)."""

    name = "HANG"

    def act(self) -> None:
        block_forever_here()


def block_forever_here() -> None:
    while True:
        time.sleep(1)


def hang_once():
    return HangOnce(), Blobs(128, 1)


class SlowOnOneRank(Dataset):
    """Blobs that take $DDPTUI_TEST_SLOW_S seconds a sample on rank $DDPTUI_TEST_SLOW_RANK (or
    on every rank: `all`)."""

    classes = Blobs.classes

    def __init__(self):
        self.inner = Blobs(4096, 0)
        self.delay = float(os.environ["DDPTUI_TEST_SLOW_S"])
        self.rank = os.environ["DDPTUI_TEST_SLOW_RANK"]

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        # A standby reads a sample before it joins a process group (its warm-up).
        if self.rank == "all" or (torch.distributed.is_initialized()
                                  and str(torch.distributed.get_rank()) == self.rank):
            time.sleep(self.delay)
        return self.inner[i]


def slow_on_one_rank():
    return SlowOnOneRank(), Blobs(64, 1)


def slow_forward_cnn(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """tiny_cnn whose forward waits 30 ms more on rank 1: the straggler the phases name."""
    net = tiny_cnn(num_classes, in_channels)
    net.register_forward_pre_hook(_wait_30_ms_on_rank_1)
    return net


def _wait_30_ms_on_rank_1(*_) -> None:
    if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
        time.sleep(0.03)
