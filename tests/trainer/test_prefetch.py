"""The prefetching thread of --decode gpu, on its own: order, early close, errors."""

from __future__ import annotations

import threading

import pytest
import torch

from ddptui.contract.options.errors import DataError
from ddptui.rank.prefetch import threaded_batches

CPU = torch.device("cpu")


def _preparing() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "prepare"]


def test_batches_come_in_order_and_the_thread_ends_with_the_epoch():
    loader = [(torch.full((2,), i), torch.tensor([i])) for i in range(7)]
    got = [labels.item() for _, labels in threaded_batches(loader, CPU, lambda b: b, None)]
    assert got == list(range(7))
    assert not _preparing()


def test_closing_early_ends_the_thread_even_while_it_waits_to_hand_over():
    loader = [(torch.zeros(2), torch.tensor([i])) for i in range(50)]
    batches = threaded_batches(loader, CPU, lambda b: b, None, depth=2)
    assert next(batches)[1].item() == 0
    assert _preparing()  # it has filled the queue and waits
    batches.close()  # what a stop or a world change does mid-epoch
    assert not _preparing()


def test_an_error_on_the_thread_is_raised_to_the_training_loop():
    def loader():
        yield torch.zeros(2), torch.tensor([0])
        raise DataError("corrupt or unreadable sample x.jpg")

    batches = threaded_batches(loader(), CPU, lambda b: b, None)
    assert next(batches)[1].item() == 0
    with pytest.raises(DataError, match="x.jpg"):
        next(batches)
    assert not _preparing()
