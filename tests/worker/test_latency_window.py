"""The worker's recent interactive latency (worker/latency_window.py): P90s over a sliding window."""

from __future__ import annotations

from vllm_fleet.worker.latency_window import LatencyWindow


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_p90_of_the_recent_first_tokens_and_per_token_gaps():
    clock = Clock()
    window = LatencyWindow(window_s=2.0, clock=clock)
    assert window.ttft_p90_ms() == 0.0 and window.itl_p90_ms() == 0.0  # nothing lately: no report
    for ms in range(1, 11):                    # first tokens after 10..100 ms
        window.first_token(ms / 100)
    assert window.ttft_p90_ms() == 90.0        # the 9th of 10
    window.tokens(0.2, 4)                      # four tokens 200 ms after the last: 50 ms each
    window.tokens(0.03, 1)
    assert window.itl_p90_ms() == 50.0
    window.tokens(0.5, 0)                      # no tokens (a final chunk's finish reason alone): no gap
    assert window.itl_p90_ms() == 50.0


def test_old_samples_leave_the_window():
    clock = Clock()
    window = LatencyWindow(window_s=2.0, clock=clock)
    window.tokens(1.0, 1)                      # a slow step...
    clock.now += 1.5
    window.tokens(0.02, 1)
    assert window.itl_p90_ms() == 1000.0       # ...still in the window
    clock.now += 1.0
    assert window.itl_p90_ms() == 20.0         # ...gone 2 s later
    clock.now += 5.0
    assert window.itl_p90_ms() == 0.0


def test_the_baseline_is_learnt_only_while_no_batch_runs_here():
    clock = Clock()
    window = LatencyWindow(window_s=2.0, clock=clock)
    window.batch_started()                     # a batch request runs: its company slows the gaps
    for _ in range(60):
        clock.now += 0.05
        window.tokens(0.05, 1)
    assert window.itl_baseline_ms() == 0.0     # nothing learnt while it ran
    window.batch_ended()
    clock.now += 0.01
    window.tokens(0.05, 1)                     # this gap began before batch left: not without batch
    for _ in range(29):
        clock.now += 0.02
        window.tokens(0.02, 1)
    assert window.itl_baseline_ms() == 0.0     # 29 gaps without batch: a window is 30
    clock.now += 0.02
    window.tokens(0.02, 1)
    assert window.itl_baseline_ms() == 20.0    # the 30th: the P90 of gaps with no batch anywhere here
    assert window.itl_p90_ms() == 50.0         # the recent window still holds batch's slow gaps


def test_a_first_token_teaches_the_baseline_only_if_no_batch_ran_since_its_request_started():
    clock = Clock()
    window = LatencyWindow(clock=clock)
    window.batch_started()
    clock.now += 1.0
    window.batch_ended()
    clock.now += 0.2
    for _ in range(10):
        window.first_token(0.5)                # waited since before batch left
    assert window.ttft_baseline_ms() == 0.0
    for _ in range(10):
        window.first_token(0.1)
    assert window.ttft_baseline_ms() == 100.0


def test_the_floor_is_over_a_target_only_when_the_samples_show_a_miss():
    clock = Clock()
    window = LatencyWindow(clock=clock)
    for _ in range(26):
        window.tokens(0.02, 1)
    for _ in range(4):                         # 4 slow of 30: the P90 is a slow gap...
        window.tokens(0.1, 1)
    assert window.itl_p90_ms() == 100.0
    assert window.itl_p90_floor_ms() == 20.0   # ...but 4 of 30 is what noise does: no miss
    for _ in range(10):                        # 14 slow of 40: a miss beyond doubt
        window.tokens(0.1, 1)
    assert window.itl_p90_floor_ms() == 100.0


def test_the_load_carries_the_floors_and_baselines():
    from vllm_fleet.protocol import WorkerLoad
    from vllm_fleet.protocol.convert import load_from_pb, load_to_pb

    load = WorkerLoad(interactive_ttft_p90_ms=90.0, interactive_itl_p90_ms=40.0, interactive_ttft_p90_floor_ms=80.0,
                      interactive_itl_p90_floor_ms=35.0, interactive_ttft_baseline_ms=70.0,
                      interactive_itl_baseline_ms=30.0)
    assert load_from_pb(load_to_pb(load)) == load
