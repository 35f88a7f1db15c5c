"""--decode gpu in a process of its own beside each rank: another CUDA context and another GIL,
so the decoder's host calls (about 10 ms a batch) never hold up the training thread's launches.
Finished batches come back through a ring of device buffers shared once (CUDA IPC).

Beside a training step in the same process, decoding took twice as long as alone and training
ran at 0.71-0.77 of its rate (docs/benchmarks.md, session 7): both need the one GIL and the one
context's host side. Here the rank only hands over the loader's batches and normalises.
"""

from __future__ import annotations

import contextlib
import os
import queue
from collections import deque
from collections.abc import Callable, Iterable, Iterator

import torch

from trainer.elastic.lifeline import die_with_parent
from trainer.pipeline.forkserver import worker_context
from trainer.pipeline.prefetch import Normalize

SLOTS = 4  # one being normalised, three decoding or decoded ahead (the loader's lead)


def wanted(device: torch.device) -> bool:
    """On by default on CUDA; DDPTUI_DECODE_PROCESS=0 decodes on a thread of the rank as
    before, =1 uses the process on CPU ranks too (how the tests run it)."""
    chosen = os.environ.get("DDPTUI_DECODE_PROCESS", "")
    return chosen == "1" or (chosen != "0" and device.type == "cuda")


class DecodeProcess:
    """The rank's side: starts the process at once (its imports and CUDA start-up overlap the
    rank's), sends it the loader's batches and yields normalised (images, labels)."""

    def __init__(self, device: torch.device, size: int, batch_size: int, normalize: Normalize,
                 undecodable: Callable[[str], None], codec: str | None = None,
                 slots: int = SLOTS):
        self.device, self.normalize, self.undecodable = device, normalize, undecodable
        self.cuda = device.type == "cuda"
        ctx = worker_context(self.cuda) or torch.multiprocessing.get_context("spawn")
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(
            target=serve, name="ddptui-decode", daemon=True,
            args=(str(device), size, batch_size, slots, codec, self.requests, self.replies))
        self.process.start()
        self.slots = slots
        self.images = self.labels = self.free = None
        self.name = "starting"
        self.outstanding = 0  # batches sent that a closed generator did not take back

    def ready(self) -> str:
        """Wait for the process's buffers; returns its codec's name."""
        if self.images is None:
            self.images, self.labels, self.free, self.name = self._reply("slots")
        return self.name

    def batches(self, loader: Iterable) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.ready()
        while self.outstanding:  # a closed generator's batches: decoded for nobody
            self._reply("ready")
            self.outstanding -= 1
        it = iter(loader)
        free, sent = list(range(self.slots)), deque()
        compute = torch.cuda.current_stream(self.device) if self.cuda else None

        def send() -> None:
            while free and (batch := next(it, None)) is not None:
                flat, lengths, boxes, labels, paths = batch
                slot = free.pop()
                self.requests.put((slot, flat, lengths, boxes, labels, paths))
                sent.append(slot)

        try:
            send()
            while sent:
                slot, n, failed = self._reply("ready")
                assert slot == sent.popleft(), "the decode process answered out of order"
                for path in failed:
                    self.undecodable(path)
                # New tensors on the compute stream: the slot is free once these are queued.
                images = self.normalize(self.images[slot][:n])
                labels = self.labels[slot][:n].clone()
                if compute is not None:
                    self.free[slot].record(compute)
                free.append(slot)
                send()
                yield images, labels
        finally:
            self.outstanding += len(sent)

    def _reply(self, kind: str):
        while True:
            try:
                reply = self.replies.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(f"the decode process ended (exit code "
                                       f"{self.process.exitcode})") from None
        if reply[0] == "error":
            raise RuntimeError(f"decode process: {reply[1]}")
        assert reply[0] == kind, reply[0]
        return reply[1:]

    def stop(self) -> None:
        """Let go of the shared buffers first (the process owns them), then end it."""
        self.images = self.labels = self.free = None
        if self.process.is_alive():
            self.requests.put(None)
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        for q in (self.requests, self.replies):
            q.close()
            q.cancel_join_thread()


def serve(device_name: str, size: int, batch_size: int, slots: int, codec: str | None,
          requests, replies) -> None:
    """The process: decode each batch into the slot the rank named, after the rank's last use
    of that slot (its event), and answer once the slot holds it."""
    die_with_parent()  # the fork server, which ends with the rank
    from trainer.pipeline.gpudecode import Decoder, choose_codec

    try:
        device = torch.device(device_name)
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.set_device(device)
        failed: list[str] = []
        decoder = Decoder(device, size, None, choose_codec(device, codec), failed.append)
        images = [torch.empty(batch_size, 3, size, size, dtype=torch.uint8, device=device)
                  for _ in range(slots)]
        labels = [torch.empty(batch_size, dtype=torch.long, device=device) for _ in range(slots)]
        if not cuda:
            for t in images + labels:
                t.share_memory_()
        free = [torch.cuda.Event(interprocess=True) for _ in range(slots)] if cuda else None
        replies.put(("slots", images, labels, free, decoder.codec.name))
        stream = torch.cuda.Stream(device) if cuda else None
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            while (request := requests.get()) is not None:
                slot, flat, lengths, boxes, label, paths = request
                failed.clear()
                out = decoder.crops(flat, lengths, boxes, paths)
                if cuda:
                    stream.wait_event(free[slot])
                n = len(lengths)
                images[slot][:n].copy_(out.round_().clamp_(0, 255))
                labels[slot][:n].copy_(label)
                if cuda:
                    stream.synchronize()
                replies.put(("ready", slot, n, list(failed)))
    except BaseException as e:  # the rank raises it
        replies.put(("error", f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None

