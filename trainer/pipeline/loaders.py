"""The rank's DataLoaders for the settings in force, and the batch iterator each pipeline
(synthetic, plain, side-stream prefetch, GPU decode on a thread) hands the loop.
"""

from __future__ import annotations

import torch

from ddptui.contract.options.config import RunConfig
from ddptui.rank.prefetch import (
    Normalize,
    ToDevice,
    plain_batches,
    prefetched_batches,
    side_stream,
    threaded_batches,
)
from ddptui.rank.sampler import ShardedBatchSampler
from ddptui_trainer.pipeline.badsamples import BadSamples, skip
from ddptui_trainer.pipeline.datasets import (
    DataBundle,
    SyntheticBatches,
    build_train_loader,
    build_val_loader,
)
from ddptui_trainer.rank import Rank


class Loaders:
    """The DataLoaders for the settings in force; rebuilt when the worker count changes."""

    def __init__(self, config: RunConfig, me: Rank, bundle: DataBundle,
                 sampler: ShardedBatchSampler, settings: dict,
                 batch_dtype: torch.dtype | None = None):
        """`batch_dtype`: what prepared batches are stored as (--amp's dtype on GPUs; float32
        by default)."""
        self.config, self.me, self.bundle, self.sampler = config, me, bundle, sampler
        normalize = Normalize(bundle.in_channels, me.device, config.model.channels_last,
                              batch_dtype or torch.float32)
        self.bad = BadSamples(config.data.bad_sample_limit(bundle.num_train))
        if bundle.collate is not None:  # --decode gpu (torchvision: imported only then)
            from ddptui_trainer.pipeline.gpudecode import Decoder, TorchvisionCodec

            self.prepare = Decoder(me.device, config.data.resolved_image_size, normalize,
                                   TorchvisionCodec(me.device), self._undecodable)
        else:
            self.prepare = ToDevice(me.device, normalize)
        for dataset in (bundle.train, bundle.val):
            if dataset is not None and hasattr(dataset, "notes"):  # set before workers start
                dataset.notes = self.bad.notes
        self.train = self.val = None
        self.val_ahead = None  # the validation batches arm_val set loading, until validation
        self.workers = None
        self.stream = side_stream(me.device)  # prefetching's, for the whole run
        self.apply(settings)

    def bad_in(self, epoch: int) -> int:
        """Corrupt samples skipped in `epoch` (every time one was met, on this rank)."""
        self.bad.read()
        return self.bad.per_epoch[epoch]

    def _undecodable(self, path: str) -> None:
        """A JPEG whose header read but whose data the rank's codec could not decode: skipped
        and counted like the workers' corrupt samples (an error with --max-bad-samples 0)."""
        codec = self.prepare.codec.name.split(" (")[0]
        skip(self.bad.notes, self.sampler.epoch, path, f"{codec} could not decode it")

    def apply(self, settings: dict) -> None:
        if settings["workers"] == self.workers or self.bundle.train is None:
            return
        self.close()
        self.workers = settings["workers"]
        cuda = self.me.device.type == "cuda"
        self.train = build_train_loader(self.bundle, self.sampler, self.workers, cuda)
        self.val = self._val_loader()

    def reshard(self) -> None:
        """After a world change: the validation shard follows the new rank and world size (the
        training batches follow the sampler already)."""
        if self.val is not None:
            self.close(train=False)
            self.val = self._val_loader()

    def _val_loader(self):
        return build_val_loader(self.bundle, self.config.train.batch_size, self.me.rank,
                                self.me.world_size, self.workers, self.me.device.type == "cuda")

    def arm_val(self) -> None:
        """Near the epoch's end: the validation workers start (the first time) and load while
        the last steps train, so validation finds its first batches ready (docs/benchmarks.md,
        epoch ends)."""
        if self.val is not None and self.val_ahead is None:
            self.val_ahead = iter(self.val)

    def val_batches(self):
        """The validation batches, prepared on the compute stream: those arm_val set loading,
        else a pass started now (iterating the loader again would restart it)."""
        batches, self.val_ahead = self.val_ahead or self.val, None
        return plain_batches(batches, self.prepare)

    def start_workers(self) -> None:
        """A standby starts its workers ahead of the join (what it loads now is thrown away)."""
        if self.train is not None and self.workers:
            iter(self.train)

    def train_batches(self, prefetch: bool, mark=lambda phase: None):
        """The epoch's batches on the device; `mark("h2d")` as a batch the loop waited for is
        copied there on the compute stream (the prefetcher's copies are not the loop's)."""
        if self.bundle.train is None:
            return iter(SyntheticBatches(self.sampler, self.config.train.batch_size,
                                         self.config.data.resolved_image_size, self.bundle.num_classes,
                                         self.me.device, self.config.model.channels_last))
        if prefetch and self.config.data.decode == "gpu":
            return threaded_batches(self.train, self.me.device, self.prepare, self.stream)
        if prefetch and self.me.device.type == "cuda":
            return prefetched_batches(self.train, self.me.device, self.prepare, self.stream)
        return plain_batches(self.train, self.prepare, mark)

    def close(self, train: bool = True) -> None:
        """Persistent workers end with the last reference to their loader, so dropping the
        loaders ends them now rather than at interpreter exit (the epoch's batch iterator is
        closed by then)."""
        if train:
            self.train = None
        self.val = self.val_ahead = None
