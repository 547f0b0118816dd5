"""What the bench writes down about one request: its timeline, in seconds on one monotonic clock."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """The timeline of one request as the client saw it.

    `chunk_times[i]` is when the i-th chunk carrying output arrived and `chunk_tokens[i]` how
    many tokens it carried (streams may coalesce several tokens into one chunk). Times are
    seconds on the runner's clock; `scheduled` is when the arrival process wanted the request
    sent, `start` when it was (they differ when the client itself falls behind).
    """

    request_id: str
    kind: str = "random"                 # workload item kind: random, question, conversation, summary, ...
    session_id: str = ""
    scheduled: float = 0.0
    start: float = 0.0
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0               # as reported by the server (0 when it does not say)
    output_tokens: int = 0               # usage when reported, else the sum of chunk_tokens
    expected_output_tokens: int = 0      # what the workload asked for (max_tokens)
    ignore_eos: bool = False             # whether the request asked for exactly that many tokens
    error: str | None = None             # kind of failure (e.g. "http_429", "WorkerUnavailableError")
    error_message: str | None = None
    warmup: bool = False

    @property
    def short_answer(self) -> bool:
        """Answered, but with fewer tokens than asked although `ignore_eos` was set: the server
        stopped early (it dropped ignore_eos, or hit its context limit), so the answer is not the
        work the bench asked for and must not be scored as if it were."""
        return (self.error is None and self.ignore_eos and self.expected_output_tokens > 0
                and self.output_tokens < self.expected_output_tokens)

    @property
    def ok(self) -> bool:
        """A success: no error, and the whole answer that was asked for."""
        return self.error is None and not self.short_answer

    @property
    def ttft(self) -> float | None:
        """Time to first token: from sending to the first chunk with output."""
        return self.chunk_times[0] - self.start if self.chunk_times else None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (E2E - TTFT) / (output tokens - 1)."""
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - ttft) / (self.output_tokens - 1)

    def inter_token_latencies(self) -> list[float]:
        """Gaps between output tokens as they arrived.

        A chunk carrying k tokens after a gap g stands for k tokens each g/k apart, so a
        server that coalesces tokens is neither rewarded with fewer samples nor punished
        with one long gap per chunk.
        """
        gaps: list[float] = []
        for i in range(1, len(self.chunk_times)):
            gap = self.chunk_times[i] - self.chunk_times[i - 1]
            tokens = max(1, self.chunk_tokens[i] if i < len(self.chunk_tokens) else 1)
            gaps.extend([gap / tokens] * tokens)
        return gaps

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ttft"], data["tpot"], data["e2e"] = self.ttft, self.tpot, self.e2e
        data["short_answer"] = self.short_answer
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)
