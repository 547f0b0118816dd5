"""The attempt seam (router/attempt_hooks.py): a hook added to the StreamContext hears every
point of a request's attempts in order (a failover included) with the handle its `prepare` gave,
may change the request sent to each worker, and a hook that returns no handle hears nothing more.
What a `prepare` says the workers hold of the prompt (`stream.cache`) is not owed on a lease."""

from __future__ import annotations

import dataclasses

from fakes import addresses
from test_never_empty import Workers, request, router_over
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.router.attempt_hooks import Attempt, AttemptHooks, HookedStream
from vllm_fleet.router.cache.match import CacheMatch


class Recorder(AttemptHooks):
    def __init__(self, *, handle: object | None = "handle") -> None:
        self.handle = handle
        self.heard: list[tuple] = []
        self.sent: list[str] = []

    async def prepare(self, stream: HookedStream) -> object | None:
        self.heard.append(("prepare", stream.request.request_id))
        return self.handle

    async def picking(self, handle: object) -> None:
        self.heard.append(("picking", handle))

    def routed(self, handle: object, attempt: Attempt) -> None:
        self.heard.append(("routed", handle, attempt.address, attempt.resumed))
        attempt.request = dataclasses.replace(attempt.request, priority=7)

    def first_token(self, handle: object, attempt: Attempt) -> None:
        self.heard.append(("first_token", handle, attempt.address))

    def chunk(self, handle: object, attempt: Attempt, chunk, first: bool) -> None:
        self.heard.append(("chunk", handle, chunk.text, first))

    def attempt_ended(self, handle: object, attempt: Attempt, error: BaseException | None) -> None:
        self.heard.append(("attempt_ended", handle, attempt.address, type(error).__name__ if error else None))

    def ended(self, handle: object, outcome: str) -> None:
        self.heard.append(("ended", handle, outcome))


def with_hook(router, hook: AttemptHooks) -> None:
    router._context = dataclasses.replace(router._context, hooks=(*router._context.hooks, hook))  # noqa: SLF001


class Priorities(Workers._Attempt):
    async def generate(self, request, *, timeout=None):
        self.workers.priorities.append(request.priority)
        async for chunk in super().generate(request, timeout=timeout):
            yield chunk


async def test_a_hook_hears_each_attempt_of_a_failover_in_order_and_may_change_what_is_sent():
    async with router_over(2) as (router, workers):
        recorder = Recorder()
        with_hook(router, recorder)
        workers.priorities = []

        def first_fails(address: str) -> Priorities:  # the first attempt fails before its first token
            workers.failing = not workers.attempts
            return Priorities(workers, address)
        router._context = dataclasses.replace(router._context, connect=first_fails)  # noqa: SLF001
        async with router.stream(request("r1")) as stream:
            text = "".join([chunk.text async for chunk in stream])
        assert text == "ab" and stream.attempts == 2
        first, second = workers.attempts
        h = "handle"
        assert recorder.heard == [
            ("prepare", "r1"),
            ("picking", h), ("routed", h, first, False), ("attempt_ended", h, first, "WorkerUnavailableError"),
            ("picking", h), ("routed", h, second, False), ("first_token", h, second),
            ("chunk", h, "a", True), ("chunk", h, "b", False), ("attempt_ended", h, second, None),
            ("ended", h, "ok"),
        ]
        assert workers.priorities == [7, 7]   # what `routed` set is what each worker got


async def test_a_hook_without_a_handle_for_a_request_hears_only_prepare():
    async with router_over(1) as (router, workers):
        workers.failing = False
        recorder = Recorder(handle=None)
        with_hook(router, recorder)
        async with router.stream(request("r2")) as stream:
            assert "".join([chunk.text async for chunk in stream]) == "ab"
        assert recorder.heard == [("prepare", "r2")]


class HeldPrompt(AttemptHooks):
    """Says, as the cache hook does, that every worker holds `held` leading tokens of the prompt,
    and notes the tokens the attempt's lease owes its worker when routed and after the first chunk."""

    def __init__(self, router, held: int) -> None:
        self.router, self.held = router, held
        self.owed: list[int] = []

    async def prepare(self, stream: HookedStream) -> object | None:
        stream.cache = CacheMatch(cached_tokens={a: self.held for a in addresses(1)})
        return "handle"

    def _note(self, address: str) -> None:
        self.owed.append(self.router.snapshot().get(address).outstanding_tokens)

    def routed(self, handle: object, attempt: Attempt) -> None:
        self._note(attempt.address)

    def chunk(self, handle: object, attempt: Attempt, chunk, first: bool) -> None:
        if first:
            self._note(attempt.address)


async def test_prompt_tokens_the_worker_holds_are_not_owed_on_its_lease():
    # A 40-token prompt and a 2-token answer, 32 of the prompt in the worker's cache: the lease owes
    # the 8 it prefills and the answer; the first chunk pays the prefill and its own token.
    async with router_over(1) as (router, workers):
        workers.failing = False
        hook = HeldPrompt(router, held=32)
        with_hook(router, hook)
        held = build_request("r3", [GenerateInput(token_ids=list(range(40)))], SamplingParams(max_tokens=2))
        async with router.stream(held) as stream:
            assert "".join([chunk.text async for chunk in stream]) == "ab"
        assert hook.owed == [8 + 2, 1]
