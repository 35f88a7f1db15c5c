"""NCCL's flight recorder, asked through its pipe and read without torch: which rank never
joined the collective the others are in."""

from __future__ import annotations

import os


def test_the_nccl_flight_recorder_is_asked_through_its_pipe_and_read_without_torch(tmp_path):
    """What torch's NCCL watchdog does, played here: a FIFO it reads without blocking, and a
    dump written with torch's pickler (typed lists as torch.jit._pickle calls) once asked."""
    import pickle

    import torch.jit._pickle

    from ddptui.contract.observe.flight import FlightDumps, summary

    class IntList(list):  # pickled as torch's pickler writes List[int]
        def __reduce__(self):
            return torch.jit._pickle.build_intlist, (list(self),)

    prefix = str(tmp_path / "x.nccl-trace-rank")
    dumps = FlightDumps(prefix)
    assert not dumps.ask(0, now=0.0)  # no pipe: no NCCL group, nothing to wait for
    os.mkfifo(prefix + "0.pipe")
    assert not dumps.ask(0, now=0.0)  # a pipe nobody reads (the rank's watchdog is gone)
    reader = os.open(prefix + "0.pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert dumps.ask(0, now=0.0)
        assert os.read(reader, 128) == b"1"
        assert dumps.collect(now=1.0) == []  # asked, not written yet
        entry = {"profiling_name": "nccl:all_reduce", "collective_seq_id": 41,
                 "state": "completed", "process_group": ("0", "default_pg"),
                 "input_sizes": [IntList([256, 1000])]}
        trace = {"version": "2.4", "entries": [entry, {**entry, "collective_seq_id": 42,
                                                        "state": "started"}]}
        with open(prefix + "0", "wb") as f:
            pickle.dump(trace, f)
        assert dumps.collect(now=1.1) == []  # seen once: is it still growing?
        ((slot, read),) = dumps.collect(now=1.2)
        assert slot == 0 and read["entries"][0]["input_sizes"] == [[256, 1000]]
        assert summary(read) == "NCCL: in all_reduce #42 (started), process group default_pg"
        assert dumps.ask(0, now=2.0)
        assert dumps.collect(now=2.0 + 31) == [(0, None)]  # asked, and no dump came
    finally:
        os.close(reader)
    dumps.remove_pipes([0, 1])
    assert not os.path.exists(prefix + "0.pipe")


def test_the_nccl_dumps_name_the_rank_that_never_joined_the_collective_the_others_are_in():
    """DDP's all-reduce runs behind the Python: a rank that waits for a peer shows user code in
    its stacks, but its dump has all_reduce #42 open while the peer never enqueued #42."""
    from ddptui.contract.observe.flight import behind, compact

    def trace(*entries):  # compact: as attach gets it from a wrapped rank, too
        return compact({"entries": [{"pg_id": 0, "profiling_name": "nccl:all_reduce",
                                     "collective_seq_id": seq, "state": state}
                                    for seq, state in entries]})

    done41 = [(40, "completed"), (41, "completed")]
    assert behind({0: trace(*done41, (42, "started")), 1: trace(*done41),
                   2: trace(*done41, (42, "scheduled"))}) == {
        0: ("all_reduce #42 (NCCL)", [1]), 2: ("all_reduce #42 (NCCL)", [1])}
    # every rank in #42: no rank is behind, so nobody is named
    assert behind({0: trace(*done41, (42, "started")), 1: trace(*done41, (42, "started"))}) == {}
