"""The input watch on its own: when ranks wait for data it names them once, with the knob most
likely to help; it says when the input keeps up again, and again after a switch (no processes)."""

from __future__ import annotations

from ddptui.contract.protocol.events import Step
from ddptui.run.inputwatch import HOLD, InputWatch, Pipeline, knob

CPU_DECODE = Pipeline(cuda=True, decode="cpu", files=True, workers=4, prefetch=True, ranks=2,
                      cores=32)


def _steps(watch, wait: float, ranks=(0, 1), events: int = 12, start: int = 10) -> None:
    for i in range(events):
        for rank in ranks:
            watch.observe(Step(rank=rank, epoch=0, step=start + 2 * i, global_step=0, loss=None,
                               steps=2, step_ms=100.0, data_wait=wait))


def _checks(watch, pipeline=CPU_DECODE, members=(0, 1), times: int = HOLD) -> list:
    """(text, level, the event's fields as the log has them) of what it said."""
    return [(said.text, said.level, said.fields()) for _ in range(times)
            if (said := watch.check(list(members), pipeline))]


def test_ranks_that_wait_for_data_are_named_once_with_a_knob_after_the_change_held():
    w = InputWatch()
    _steps(w, 0.25)
    assert _checks(w, times=HOLD - 1) == []  # held for less than 3 s: nothing yet
    said = _checks(w, times=1)
    assert len(said) == 1
    text, level, fields = said[0]
    assert level == "warning" and fields["input_wait"] == {"ranks": [0, 1], "data_wait": 0.25,
                                                           "knob": "W"}
    assert text == ("input holds ranks 0, 1 back: up to 25% of a step waiting for data; W may "
                    "help: 4 workers a rank; about 6 would keep up, and the host has 16 cores for "
                    "each rank")
    assert _checks(w, times=3 * HOLD) == []  # said once


def test_it_keeps_up_again_only_below_half_the_threshold():
    w = InputWatch()
    _steps(w, 0.25)
    assert len(_checks(w)) == 1
    _steps(w, 0.07)  # under 10% but not 5%: no flapping either way
    assert _checks(w, times=3 * HOLD) == []
    _steps(w, 0.01)
    (text, level, fields), = _checks(w)
    assert text == "input keeps up again: 1% of a step at most waiting for data"
    assert level == "info" and fields["input_wait"]["ranks"] == []


def test_after_a_switch_it_says_how_it_went():
    w = InputWatch()
    _steps(w, 0.25)
    assert len(_checks(w)) == 1
    more = Pipeline(**{**CPU_DECODE.__dict__, "workers": 15})
    w.fresh([0, 1])
    _steps(w, 0.2)
    (text, _, fields), = _checks(w, more)  # still waiting: the next thing to try
    assert fields["input_wait"]["knob"] == "--decode gpu" and "--decode gpu" in text
    w.fresh([0, 1])
    _steps(w, 0.08, start=100)
    assert _checks(w, more) == []  # 8% under the same settings: nothing new


def test_an_epochs_first_batch_and_a_fresh_pipeline_do_not_count():
    w = InputWatch()
    for _ in range(12):  # every figure covers an epoch's first steps: the workers' start
        w.observe(Step(rank=0, epoch=0, step=2, global_step=0, loss=None, steps=2,
                       step_ms=100.0, data_wait=0.9))
    assert w.shares([0]) == {}
    w.fresh([0])
    w.observe(Step(rank=0, epoch=0, step=50, global_step=0, loss=None, steps=2, step_ms=100.0,
                   data_wait=0.9))
    assert w.shares([0]) == {}
    _steps(w, 0.3, ranks=(0,), events=5)
    assert w.shares([0]) == {}  # 10 steps: under the 20-step window
    _steps(w, 0.3, ranks=(0,), events=5, start=60)
    assert w.shares([0]) == {0: 0.3}


def test_a_rank_without_figures_keeps_the_watch_quiet():
    w = InputWatch()
    _steps(w, 0.5, ranks=(0,))
    assert _checks(w, times=2 * HOLD) == []


def test_the_knob_follows_the_settings_the_wait_and_the_host():
    def k(wait=0.25, **kw):
        return knob(Pipeline(**{**CPU_DECODE.__dict__, **kw}), wait)[0]

    assert k(workers=0) == "W"
    assert k(prefetch=False) == "p"
    assert k(cuda=False, prefetch=False) == "W"  # no prefetcher on CPU ranks
    assert k() == "W"  # 4 workers at 25%: about 6 would do, of 16 cores for each rank
    assert k(wait=0.72, workers=12) == "--decode gpu"  # about 43 would: more than the host has
    assert k(wait=0.72, workers=12, files=False) == "W"  # some help, all it can do
    assert k(wait=0.72, workers=15, files=False) is None  # every core loading already
    assert k(decode="gpu", workers=12) == "w"
    assert k(decode="gpu", workers=12, ranks=1) is None
    assert k(decode="gpu", workers=3) is None
    assert knob(CPU_DECODE, 0.8)[1] == ("4 workers a rank; about 20 would keep up, and the host "
                                        "has 16 cores for each rank: a run with --decode gpu "
                                        "decodes the JPEGs on the GPUs")
