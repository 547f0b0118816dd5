"""CacheHook: cache routing around a stream's attempts (router/attempt_hooks.py).

Before the pick it keys the prompt and asks the index who holds it (CacheRouting.match): the
features get the router's token count of the prompt; the handle keeps the prompt's keys and ids,
and what the index answered (a CacheMatch, router/cache/match.py), while the request is in
flight; the stream gets that answer as `stream.cache`, hands it to the policy, and does not count
a worker's held tokens on its lease. Each attempt holds the prompt's blocks on its worker as
speculative entries from the pick to the first token, then for the event delay (RoutedHold);
an attempt that ends before it stored nothing releases them. A worker that takes the router's
ids gets them on a first attempt. A chat answer the caller got is tokenized for the next turn.

Where one worker at most can take the request (its model's only serving worker), there is no
decision to make: the hook keys nothing and the request routes as under any other policy (#49
goal 2: routing costs nothing where it cannot help). The worker renders the prompt itself then,
and its own prefix cache finds whatever it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from vllm_fleet.protocol.types import Chunk
from vllm_fleet.router.attempt_hooks import Attempt, AttemptHooks, HookedStream
from vllm_fleet.router.cache.index import RoutedHold
from vllm_fleet.router.cache.routing import CachePrompt, CacheRouting
from vllm_fleet.router.metrics import RouterMetrics

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class CacheHandle:
    """One request's cache state: its prompt as keyed with who held it (`prompt.match`), and the
    current attempt's hold."""

    stream: HookedStream
    prompt: CachePrompt
    hold: RoutedHold | None = None


class CacheHook(AttemptHooks):
    def __init__(self, routing: CacheRouting, metrics: RouterMetrics,
                 serving: Callable[[str | None, str | None], int]) -> None:
        self.routing = routing
        self._metrics = metrics
        self._serving = serving   # Pool.serving: workers of a model and pool that could take a request

    async def prepare(self, stream: HookedStream) -> CacheHandle | None:
        routing, request, features = self.routing, stream.request, stream.features
        if self._serving(features.model, features.pool) <= 1:
            routing.no_choice += 1
            return None   # nothing to choose between: no keying, no holds (the module docstring)
        # Where the prompt's blocks are held: rendering and tokenizing a chat prompt takes
        # milliseconds, so it runs off the event loop; given token ids are read in place.
        if routing.needs_tokenizing(request):
            stream.features, prompt = await asyncio.to_thread(routing.match, request, stream.features)
        else:
            stream.features, prompt = routing.match(request, stream.features)
        stream.cache = prompt.match   # the policy's cache input, and what each worker will not prefill
        # Keep the answer's text where the router tokenizes the next turn's prompt (`ended`).
        stream.delivered.keep_text = routing.wants_answer(request)
        return CacheHandle(stream, prompt)

    def routed(self, handle: CacheHandle, attempt: Attempt) -> None:
        # The prompt counts as cached there until the attempt's first token, then for the event
        # delay; an attempt that ends before it stored nothing (released in `attempt_ended`).
        features = handle.stream.features
        handle.hold = self.routing.routed(attempt.address, features, handle.prompt)
        if not attempt.resumed:  # the prompt's ids, where this worker takes them
            attempt.request = self.routing.attempt_request(attempt.address, attempt.request, features, handle.prompt)

    def first_token(self, handle: CacheHandle, attempt: Attempt) -> None:
        if handle.hold is not None:
            handle.hold.first_token()

    def chunk(self, handle: CacheHandle, attempt: Attempt, chunk: Chunk, first: bool) -> None:
        expected = handle.prompt.ids_len
        if expected and chunk.finish_reason is not None and chunk.usage is not None and chunk.index == 0 \
                and chunk.usage.prompt_tokens != expected:
            # The router's tokenization differs from what the engine ran: its cache lookups for
            # such prompts are off (docs: routing).
            self._metrics.prompt_ids_mismatches.inc()
            logger.info("router tokenized %d prompt tokens, the worker ran %d", expected,
                        chunk.usage.prompt_tokens, extra={"request_id": handle.stream.request.request_id})

    def attempt_ended(self, handle: CacheHandle, attempt: Attempt, error: BaseException | None) -> None:
        if handle.hold is not None:
            handle.hold.release()
            handle.hold = None

    def ended(self, handle: CacheHandle, outcome: str) -> None:
        stream = handle.stream
        if outcome == "ok" and stream.delivered.keep_text:
            self.routing.answered(stream.request, stream.features, handle.prompt, stream.delivered.answer_text())
        handle.prompt.ids = None  # the ids are kept only while the request is in flight
