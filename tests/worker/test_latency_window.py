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
