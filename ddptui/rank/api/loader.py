"""run.loader(): a DataLoader for your own script whose workers, pinned memory and side-stream
prefetcher follow the dashboard (p, w/W), with cudnn.benchmark (b): at the next epoch, or with
`a` at the next agreed step, every rank at the same step, without skipping or repeating a
sample (the epoch's order is drawn once, and a new loader takes it up where the old one was).
Under run.elastic() it shards the epoch itself, so a world that shrinks takes up the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from ddptui.rank.prefetch import prefetched_batches, side_stream, to_device
from ddptui.rank.sampler import ShardedBatchSampler


class _Order(Sampler):
    """This epoch's indices from a given position: what a rebuilt loader still has to load."""

    def __init__(self, indices: list[int]):
        self.indices = indices

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class LiveLoader:
    """Iterate it as a DataLoader, once per epoch. `settings`: prefetch, workers,
    cudnn_benchmark (the dashboard's names); `pending`: asked for, not yet in force."""

    def __init__(self, dataset, batch_size: int = 1, sampler=None, shuffle: bool = False,
                 num_workers: int = 0, device: torch.device | str | None = None,
                 on_applied: Callable[[dict, dict | None], None] = lambda now, before: None,
                 **kwargs):
        self.dataset, self.batch_size, self.sampler, self.shuffle = dataset, batch_size, sampler, \
            shuffle
        # Yours is kept: without it the copies are pageable and slow (docs/benchmarks-log.md,
        # your own script); the prefetcher pins whatever you gave.
        self.pin_memory = bool(kwargs.pop("pin_memory", False))
        self.kwargs = kwargs
        cuda = torch.cuda.is_available()
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.stream = None  # the prefetcher's side stream, once `p` asks for it: one a run
        self.settings = {"prefetch": False, "workers": num_workers,
                         "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}
        self.pending: dict = {}
        self.on_applied = on_applied
        self.switch = False  # `a` was agreed: apply pending settings before the next batch
        self.epoch_order: list[int] = []
        self.taken = 0  # batches handed out this epoch
        self.waited = 0.0  # seconds the loop waited for a batch, since take_wait()
        # run.elastic(): ddptui shards the epoch's whole order, drawn as your sampler would
        # draw it; each step takes the next batch_size x world samples, this rank its slice.
        self.shards: ShardedBatchSampler | None = None
        self.restart = False  # the world or the position changed: rebuild before the next batch
        self.resume_at: int | None = None  # a rank that joined: where its first epoch is
        self.iterating = False
        self.on_epoch: Callable[[], None] = lambda: None  # an epoch's iteration begins
        self.on_next: Callable[[], object] = lambda: None  # the loop asks for the next batch
        self._epochs = 0

    def __len__(self) -> int:
        """Batches in an epoch, counted: drawing the epoch's order here would use up the random
        state that shuffles it (a framework asks for the length more than once an epoch)."""
        if self.shards is not None:
            return len(self.dataset) // (self.batch_size * self.shards.world_size)
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.kwargs.get("drop_last") else -(-n // self.batch_size)

    def __iter__(self) -> Iterator:
        self._apply()  # an epoch boundary: whatever is pending takes effect
        self.taken = 0
        if self.shards is not None:  # run.elastic: your sampler's epoch, else the epochs iterated
            self.shards.set_epoch(self.sampler.epoch if self.sampler is not None else self._epochs)
            self.shards.consumed, self.resume_at = self.resume_at or 0, None
        else:
            self.epoch_order = self._indices()
        self._epochs += 1
        self.iterating = True
        self.on_epoch()
        try:
            while True:
                self.restart = False
                batches = self._batches(self._left())
                try:
                    asked = time.perf_counter()
                    for batch in batches:
                        self.waited += time.perf_counter() - asked
                        self.taken += 1
                        yield batch
                        self.on_next()
                        if self.switch or self.restart:
                            break
                        asked = time.perf_counter()
                    else:
                        return
                finally:
                    batches.close()  # its workers end here, before new ones start
                self._apply(mid_epoch=True)
        finally:
            self.iterating = False

    def set_world(self, rank: int, world_size: int) -> None:
        """run.elastic(): shard the epoch over this world from the next batch on."""
        if self.sampler is not None and not isinstance(self.sampler, DistributedSampler):
            raise ValueError("run.elastic() shards run.loader()'s epoch itself: give it a "
                             "DistributedSampler or no sampler")
        if self.shards is None:
            s = self.sampler
            self.shards = ShardedBatchSampler(
                len(self.dataset), self.batch_size, rank, world_size,
                seed=s.seed if s is not None else 0,
                shuffle=s.shuffle if s is not None else self.shuffle, seed_stride=1)
        self.shards.set_world(rank, world_size)
        self.restart = self.iterating

    @property
    def consumed(self) -> int:
        """Samples of the epoch's order taken by completed steps (run.elastic)."""
        return self.shards.consumed if self.shards is not None else 0

    def step_done(self) -> None:
        """A step completed (run.step): under run.elastic the position moves one global step."""
        if self.shards is not None and self.iterating:
            self.shards.step_done()

    def restore(self, consumed: int) -> None:
        """Go back to a rollback point's position in this epoch."""
        self.shards.consumed = consumed
        self.restart = self.iterating

    def _left(self) -> list[int]:
        """What this rank still has to load this epoch."""
        if self.shards is None:
            return self.epoch_order[self.taken * self.batch_size:]
        return [k for batch in self.shards for _, k in batch]

    def take_wait(self) -> float:
        waited, self.waited = self.waited, 0.0
        return waited

    def _apply(self, mid_epoch: bool = False) -> None:
        """Pending settings take effect; on_applied(now, before) gets the settings that were in
        force, mid-epoch (at an epoch's start, None)."""
        self.switch = False
        if not self.pending:
            return
        before = dict(self.settings)
        self.settings.update(self.pending)
        self.pending = {}
        torch.backends.cudnn.benchmark = bool(self.settings["cudnn_benchmark"])
        self.on_applied(dict(self.settings), before if mid_epoch else None)

    def _indices(self) -> list[int]:
        """The epoch's order, drawn once (a DistributedSampler's share after set_epoch)."""
        if self.sampler is not None:
            return list(iter(self.sampler))
        if self.shuffle:
            return torch.randperm(len(self.dataset)).tolist()
        return list(range(len(self.dataset)))

    def _loader(self, indices: list[int]) -> DataLoader:
        prefetch = self.settings["prefetch"] and self.device.type == "cuda"
        return DataLoader(self.dataset, batch_size=self.batch_size, sampler=_Order(indices),
                          num_workers=int(self.settings["workers"]),
                          pin_memory=(prefetch or self.pin_memory) and self.device.type == "cuda",
                          **self.kwargs)

    def _batches(self, indices: list[int]) -> Iterator:
        loader = self._loader(indices)
        if self.settings["prefetch"] and self.device.type == "cuda":
            if self.stream is None:
                self.stream = side_stream(self.device)
            return prefetched_batches(loader, self.device, lambda b: to_device(b, self.device),
                                      self.stream)
        return (batch for batch in loader)
