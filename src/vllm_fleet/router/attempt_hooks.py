"""AttemptHooks: the one seam through which concerns act around a stream's attempts.

A RoutedStream (stream.py) knows the loop (admit, pick, stream, fail over or migrate) and
nothing of the concerns that act around it: cache routing (router/cache/hook.py), the batch gate
(router/classes/batch_hook.py) and adapter placement (adapters.py) each implement these hooks,
and the StreamContext carries them as a tuple, as Envoy's connection manager carries a filter
chain it does not look into. The stream calls, in this order:

    prepare(stream)                   once, before admission and the first pick: returns this
                                      request's handle (its per-request state), or None when the
                                      hook has nothing to do for it; may replace stream.features
                                      and set stream.cache (the cache hook)
    picking(handle)                   before each pick (awaited)
    routed(handle, attempt)           a worker was chosen; may replace attempt.request, the
                                      request sent to it
    first_token(handle, attempt)      the attempt's first chunk arrived
    chunk(handle, attempt, chunk, first)  each chunk, as the caller gets it
    attempt_ended(handle, attempt, error)  the attempt ended (error None: it completed)
    ended(handle, outcome)            the admitted request ended: "ok", "error" or "cancelled"
                                      (a request refused at admission ends without it)

Every point but `prepare` is called only with a handle that `prepare` returned, so a hook that
has nothing to do for a request costs nothing past it. All points but `prepare` and `picking`
are synchronous. A hook that raises fails the request, so hooks that only give routing hints
keep their errors to themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from vllm_fleet.protocol.types import Chunk, GenerateRequest
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.delivered import Delivered
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.pool.lease import Lease


class HookedStream(Protocol):
    """What a hook sees of a RoutedStream."""

    request: GenerateRequest
    features: RequestFeatures   # a hook's `prepare` may replace it (before admission reads it)
    cache: CacheMatch | None    # who holds the prompt's blocks: the cache hook's `prepare` sets it
    delivered: Delivered        # what the caller has; `keep_text` may be set in `prepare`

    def step_aside(self) -> None:
        """End the current attempt for interactive work (the batch gate calls it)."""


@dataclass(slots=True)
class Attempt:
    """One attempt of a stream: the worker it went to and the request sent there."""

    address: str
    lease: Lease
    request: GenerateRequest       # what is sent; `routed` hooks may replace it
    # How the request's (index) maps back to the caller's (index, sample): None unless it resumes
    # after tokens the caller has (migration or a batch pause; delivered.py)
    mapping: list[tuple[int, int]] | None

    @property
    def resumed(self) -> bool:
        return self.mapping is not None


class AttemptHooks(Protocol):
    """One concern around a stream's attempts (the module docstring). Subclasses inherit these
    no-op points and override the ones they use."""

    async def prepare(self, stream: HookedStream) -> Any | None:
        return None

    async def picking(self, handle: Any) -> None:
        return None

    def routed(self, handle: Any, attempt: Attempt) -> None:
        return None

    def first_token(self, handle: Any, attempt: Attempt) -> None:
        return None

    def chunk(self, handle: Any, attempt: Attempt, chunk: Chunk, first: bool) -> None:
        return None

    def attempt_ended(self, handle: Any, attempt: Attempt, error: BaseException | None) -> None:
        return None

    def ended(self, handle: Any, outcome: str) -> None:
        return None
