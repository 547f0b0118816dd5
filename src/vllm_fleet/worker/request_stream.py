"""One request's stream: engine events in, chunks out.

Each input of a request runs as its own engine request in a pump task, which reports what
happens as typed events (`Deltas`, `Ended`, `Failed`). A `RequestStream` turns those into the
chunks the client gets, and owns the per-request state that takes: per-(input, sample) token
counts and finished set, the held tokens of a resumed input, usage on each final chunk,
coalescing, and the request's latency metrics (TTFT, ITL) and batched output-token count.
For an OpenAI chat input it also runs vLLM's tool/reasoning parsers, one per (input, sample)
(parsing.py): the chunk's `text` is then the content, beside `reasoning` and `tool_calls`.
It does no I/O and never waits, so its behaviour is testable without an engine or a loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.protocol.types import Chunk, Usage
from vllm_fleet.worker.coalescer import Coalescer, TypedParts
from vllm_fleet.worker.engines.base import SampleDelta
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.openai.parsing import StreamParser, is_chat_request
from vllm_fleet.worker.prepare import PreparedInput

TOKEN_REPORT_S = 0.5  # how often a stream adds its streamed tokens to the output-token counter


@dataclass(slots=True)
class Deltas:
    """One engine step's output for input `index`."""

    index: int
    deltas: list[SampleDelta]


@dataclass(slots=True)
class Ended:
    """Input `index`'s engine request is over: it finished, or it was aborted (cancel, Abort RPC)."""

    index: int
    aborted: bool


@dataclass(slots=True)
class Failed:
    """Input `index`'s engine request raised; the whole request fails with it."""

    index: int
    error: Exception


StreamEvent = Deltas | Ended | Failed


class RequestStream:
    def __init__(self, inputs: list[PreparedInput], n: int, interval_s: float, metrics: WorkerMetrics,
                 started: float) -> None:
        self._prompt_lens = [item.prompt_len for item in inputs]
        self._held = [item.held for item in inputs]
        self._resumed = [item.stop_resume for item in inputs]
        # Inputs a stop string across a migration ended (resume/stops.py): the service stops their
        # engine requests.
        self.cut_inputs: set[int] = set()
        self._parsers = _StreamParsers(inputs)
        # A resumed stream's client has the echoed prompt already, from the first worker.
        self._echo = [None if item.held is not None or len(item.prompt_token_ids) > item.prompt_len
                      else item.echo_text for item in inputs]
        self._echoed: set[tuple[int, int]] = set()
        # The prompt's logprobs per input, as vLLM sent them (once, at prefill), and the streams
        # that carried them: each sample's first chunk does (a resumed input asks for none, prepare.py).
        self._prompt_logprobs: dict[int, list] = {}
        self._prompt_logprobs_sent: set[tuple[int, int]] = set()
        self._n = n
        self._coalescer = Coalescer(interval_s)
        self._metrics = metrics
        self._started = started
        self._generated: dict[tuple[int, int], int] = {}
        self._finished: set[tuple[int, int]] = set()
        self._first_token_at: float | None = None
        self._last_chunk_at = self._reported_at = started
        self._unreported_tokens = 0
        self.open_inputs = len(inputs)

    def on_deltas(self, index: int, deltas: list[SampleDelta], now: float) -> list[Chunk]:
        """The chunks due now after one engine step of input `index`."""
        chunks = []
        held, resumed = self._held[index], self._resumed[index]
        for delta in deltas:
            if resumed is not None and (delta := resumed.filter(delta)) is None:
                continue  # the stream ended at a stop string that spans the migration
            generated_ids = delta.token_ids  # the parser sees held tokens too: it was primed without them
            if held is not None:
                delta = held.strip(delta)  # the client has these ids already
            key = (index, delta.sample)
            parts = self._parse(index, delta, generated_ids)
            if delta.token_ids:
                if self._first_token_at is None:
                    self._first_token_at = now
                    self._metrics.ttft.observe(now - self._started)
                self._generated[key] = self._generated.get(key, 0) + len(delta.token_ids)
                self._unreported_tokens += len(delta.token_ids)
            usage = None
            if delta.finish_reason is not None:
                self._finished.add(key)
                usage = Usage(self._prompt_lens[index], self._generated.get(key, 0), delta.cached_tokens)
            chunk = self._coalescer.add(index, delta, now, usage, parts)
            if chunk is not None:
                if chunk.token_ids and self._first_token_at is not None and now > self._first_token_at:
                    self._metrics.itl.observe((now - self._last_chunk_at) / len(chunk.token_ids))
                self._last_chunk_at = now
                chunks.append(chunk)
        if resumed is not None and resumed.ended and index not in self.cut_inputs:
            self.cut_inputs.add(index)
            self.open_inputs -= 1
        if now - self._reported_at >= TOKEN_REPORT_S:
            self._report_tokens(now)
        return chunks

    def _parse(self, index: int, delta: SampleDelta, generated_ids: list[int]) -> TypedParts | None:
        """Turn the delta's text into content (in place) and return its other typed parts."""
        parts = None
        parser = self._parsers.get(index, delta.sample)
        if parser is not None:
            content, reasoning, tool_calls = parser.feed(delta.text, generated_ids,
                                                         finished=delta.finish_reason is not None)
            delta.text = content
            if delta.finish_reason is not None:
                delta.finish_reason = parser.finish_reason(delta.finish_reason)
            parts = TypedParts(reasoning=reasoning, tool_calls=tool_calls or None)
        echo = self._echo[index]
        if echo is not None and (index, delta.sample) not in self._echoed:
            self._echoed.add((index, delta.sample))  # a stream's first delta carries the echoed prompt
            parts = parts or TypedParts()
            parts.prompt_text = echo
        if delta.prompt_logprobs is not None:
            self._prompt_logprobs.setdefault(index, delta.prompt_logprobs)
        prompt_logprobs = self._prompt_logprobs.get(index)
        if prompt_logprobs is not None and (index, delta.sample) not in self._prompt_logprobs_sent:
            self._prompt_logprobs_sent.add((index, delta.sample))
            parts = parts or TypedParts()
            parts.prompt_logprobs = prompt_logprobs
        return parts

    def on_end(self, index: int, aborted: bool) -> list[Chunk]:
        """Input `index` is over; an aborted one ends each of its unfinished samples with "abort"."""
        if index in self.cut_inputs:
            return []  # counted as over when its stop string matched
        self.open_inputs -= 1
        if not aborted:
            return []
        chunks = []
        for sample in range(self._n):
            if (index, sample) not in self._finished:
                self._finished.add((index, sample))
                chunks.append(Chunk(index=index, sample=sample, text="", token_ids=[], finish_reason="abort"))
        return chunks

    def next_deadline(self) -> float | None:
        """When the earliest held-back (coalesced) chunk falls due; None if none is held back."""
        return self._coalescer.next_deadline()

    def on_deadline(self, now: float) -> list[Chunk]:
        """The held-back chunks due by `now`."""
        return self._coalescer.due(now)

    def close(self) -> None:
        """The stream is over, however it ended: count the tokens not yet reported."""
        self._report_tokens(self._reported_at)

    def _report_tokens(self, now: float) -> None:
        # Prometheus counters take a lock per call: a stream adds its tokens at most every
        # TOKEN_REPORT_S, not once per token.
        if self._unreported_tokens:
            self._metrics.output_tokens.inc(self._unreported_tokens)
        self._unreported_tokens, self._reported_at = 0, now


class _StreamParsers:
    """One StreamParser per (input, sample) of OpenAI chat inputs, made at the stream's first
    delta; None for a stream that is plain content."""

    def __init__(self, inputs: list[PreparedInput]) -> None:
        self._inputs = inputs
        self._parsers: dict[tuple[int, int], StreamParser | None] = {}

    def get(self, index: int, sample: int) -> StreamParser | None:
        key = (index, sample)
        if key not in self._parsers:
            self._parsers[key] = _stream_parser(self._inputs[index])
        return self._parsers[key]


def _stream_parser(item: PreparedInput) -> StreamParser | None:
    request = item.vllm_request
    if request is None or not is_chat_request(request):
        return None
    prompt = item.prompt_token_ids[:item.prompt_len]
    parser = StreamParser.create(item.parser_cls, item.tokenizer, request, prompt)
    resumed = item.prompt_token_ids[item.prompt_len:]
    if parser is not None and resumed:
        # Migration: the client has these tokens' deltas from the first worker; run them through
        # so this parser continues where that one stopped.
        parser.prime(resumed)
    return parser
