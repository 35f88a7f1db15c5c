"""The training batch sampler: one seeded permutation per epoch, cut into global steps.

Step i of an epoch consumes the next batch_size x world_size samples of the permutation and rank r
takes its slice, so the position is one number (samples consumed) that survives a checkpoint, a
DataLoader rebuilt with other settings, and a change of world size: every sample at most once.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class ShardedBatchSampler:
    """Yields this rank's batches of (epoch, index) keys from the current position onwards."""

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int,
                 seed: int = 0, shuffle: bool = True, max_steps: int | None = None,
                 seed_stride: int = 100_003):
        self.num_samples = num_samples
        # An epoch's permutation is seeded with seed x seed_stride + epoch (1: DistributedSampler's)
        self.seed_stride = seed_stride
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.max_steps = max_steps
        self.epoch = 0
        self.consumed = 0  # samples of this epoch taken by completed global steps
        self.steps_done = 0
        self._perm = self._permutation()

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning (the DistributedSampler idiom)."""
        self.epoch, self.consumed, self.steps_done = epoch, 0, 0
        self._perm = self._permutation()

    def set_world(self, rank: int, world_size: int) -> None:
        """Re-shard what is left of the epoch over a new world."""
        self.rank, self.world_size = rank, world_size

    def step_done(self) -> None:
        """Called by the loop after each optimizer step: the position moves one global step."""
        self.consumed += self.batch_size * self.world_size
        self.steps_done += 1

    def progress(self) -> float:
        """The fraction of this epoch's steps done (in any world size, and under a step cap)."""
        done = self.steps_done
        return done / max(1, done + len(self))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed, "steps_done": self.steps_done,
                "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.seed = state["seed"]
        self.set_epoch(state["epoch"])
        self.consumed, self.steps_done = state["consumed"], state["steps_done"]

    def __len__(self) -> int:
        left = (self.num_samples - self.consumed) // (self.batch_size * self.world_size)
        if self.max_steps is not None:
            left = min(left, self.max_steps - self.steps_done)
        return max(0, left)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        start = self.consumed + self.rank * self.batch_size
        stride = self.batch_size * self.world_size
        epoch, perm = self.epoch, self._perm
        for i in range(len(self)):
            first = start + i * stride
            yield [(epoch, int(k)) for k in perm[first:first + self.batch_size]]

    def _permutation(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        g = torch.Generator().manual_seed(self.seed * self.seed_stride + self.epoch)
        return torch.randperm(self.num_samples, generator=g)


def seed_sample(seed: int, epoch: int, index: int) -> None:
    """Seed torch's RNG for one sample's augmentation: the same crop whatever worker, world
    size or resume point produced it (--deterministic)."""
    # The CPU generator only: torch.manual_seed also queues a lazy seed for every accelerator,
    # each recording a traceback (0.7 ms a sample on the CI machine, more than the read).
    torch.default_generator.manual_seed((seed * 1_000_003 + epoch) * 10_000_019 + index)


def shard_indices(num_samples: int, rank: int, world_size: int) -> list[int]:
    """Validation shard: every sample exactly once across ranks, no padding."""
    return list(range(rank, num_samples, world_size))
