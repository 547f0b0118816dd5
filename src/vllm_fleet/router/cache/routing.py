"""What the cache-aware policy knows: each worker's KV-cache blocks, and the prompt's blocks.

A router whose policy is `cache_aware` keeps one CacheRouting. It follows the KV-cache events
of every worker that streams them (router/cache/follower.py) into its own bounded index
(router/cache/index.py), and for each request works out the prompt's token ids (the input's
own ids, or the router's rendering with the served model's tokenizer files: router/prompt/tokenizers.py),
their block keys, and how many leading tokens each worker holds. Every router (each gateway
process, each gateway of a fleet, each Spark executor) keeps its own from the same event
streams, so they agree on where a prefix lives; a routing decision is noted in the index while
the request prefills and for a short time after its first token (the event delay), so a burst of
one prefix follows the first request however long its prefill or queue takes.

Nothing here waits: a request whose ids are not known yet (the tokenizer still loading) is
routed by load alone, and a worker whose events are stale counts as holding nothing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from vllm_fleet.protocol.types import GenerateRequest, WorkerInfo
from vllm_fleet.router.cache.block_keys import block_keys
from vllm_fleet.router.cache.index import CacheIndex, RoutedHold
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.config import RouterConfig
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.cache.follower import KvFollower
from vllm_fleet.router.pool.worker import WorkerState
from vllm_fleet.router.cache.prefix_reuse import PrefixReuse
from vllm_fleet.router.prompt.segments import PartialIds

logger = logging.getLogger(__name__)


def cache_salt(request: GenerateRequest) -> str:
    """The request's `cache_salt` (vLLM's field): the engine shares cached blocks only within a
    salt, so the index must key the prompt with it. The body is parsed only when it has one."""
    if b'"cache_salt"' not in request.body.body_json:
        return ""
    salt = json.loads(request.body.body_json).get("cache_salt")
    return salt if isinstance(salt, str) else ""

@dataclass(slots=True)
class CachePrompt:
    """One request's prompt as the index keyed it (`CacheRouting.match`), and who held it then
    (`match`, the policy's cache input), kept by the cache hook (router/cache/hook.py) while the
    request is in flight; empty when its ids are not known (then no worker counts as holding it)."""

    block_keys: tuple[int, ...] = ()   # the prompt's blocks (only the head's while `rest_keys` is set)
    ids_len: int = 0                   # the router's token count of input 0; 0 = not (all) tokenized
    # When only a head of a long new text was keyed: the whole prompt's keys, computed on call.
    # `routed` calls it off the decision path, so the speculative entries cover the whole prompt.
    rest_keys: Callable[[], list[int]] | None = None
    # input 0's whole prompt ids as the router rendered them, for an attempt on a worker that takes
    # them (`attempt_request`); None when only a head was tokenized, the input had ids, or no worker takes them
    ids: tuple[int, ...] | None = None
    match: CacheMatch = field(default_factory=CacheMatch)   # each worker's cached tokens of it, its frontier


# A new text piece over twice `head_chars` long is tokenized head first (match). 250 characters is
# ~60-115 tokens, 4-7 blocks of 16: past the first block no worker holds in a new document, which
# is nearly always within the first few blocks (when every block of the head is held, the rest
# is tokenized then, as before). The head is what a fresh decision spends most on (~0.5 us a
# character of new words): 1,000 -> 250 took the fresh case's P50 1.5 -> 0.8 ms side by side, and
# the token count estimated from the head stayed within 10% of the exact one
# (benchmarks/results/router-decision-2026-12-04b/head_chars.txt).
# Only the decision waits for the head: the rest of a head-keyed prompt is keyed after the pick
# (`routed`), so the speculative entries still cover the whole prompt. The value is
# CacheTuning.head_chars (router/cache/tuning.py, default 250).


class CacheRouting:
    def __init__(self, config: RouterConfig, connect: Callable[[str], object], metrics, *, tokenizers=None,
                 on_change: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.index = CacheIndex(max_entries=config.cache_index_max_entries, clock=clock)
        self.tokenizers = tokenizers     # PromptTokenizers (router/prompt/tokenizers.py) or None: ids only from inputs
        self._connect = connect
        self._metrics = metrics
        self._on_change = on_change
        self.followers: dict[str, KvFollower] = {}
        self.unknown_ids = 0              # requests routed without token ids (tokenizer not ready)
        self.no_choice = 0                # requests not keyed: one worker at most could take them (hook.py)
        self.head_chars = config.cache_tuning.head_chars  # 0: tokenize every prompt whole (match)
        self._block_sizes: dict[str, int] = {}      # model -> block size its workers' Info gave
        # address -> [predicted cached tokens, prompt tokens routed, of those held more elsewhere]
        self._predicted: dict[str, list[int]] = {}
        self._keying: concurrent.futures.ThreadPoolExecutor | None = None  # the rest of head-keyed prompts
        self._id_takers: dict[str, str] = {}  # address -> tokenizer digest, of workers that take router ids
        self._told_no_events: set[str] = set()  # workers already named in the log for relaying no events
        self._reuse: dict[str, PrefixReuse] = {}  # model -> what a prompt's home is worth (policies.CacheAware)

    # --- following the pool (pool/listener.py) -------------------------------------------------

    def joined(self, worker: WorkerState) -> None:
        address = worker.address
        self._metrics.watch_cache(address, fresh=lambda: self.fresh(address),
                                  hits=lambda: worker.load.prefix_cache_hits if worker.load else 0,
                                  queries=lambda: worker.load.prefix_cache_queries if worker.load else 0)

    def left(self, address: str) -> None:
        self.forget(address)

    def info(self, worker: WorkerState) -> Awaitable[None] | None:
        """Its Info came: the follower of its events, if a new one, is the worker's task to run."""
        follower = self.on_info(worker.address, worker.info, lambda: worker.info.model if worker.info else None)
        return follower.run() if follower is not None else None

    def loaded(self, worker: WorkerState) -> None:
        pass

    def view_fields(self, address: str) -> Mapping[str, object]:
        return {"kv_events_fresh": self.fresh(address), "cache_events": self.events_state(address),
                "predicted_hit_rate": self.predicted_hit_rate(address), "copied_share": self.copied_share(address),
                "cache_blocks": self.index.entries_of(address)}

    # --- workers ------------------------------------------------------------------------

    def on_info(self, address: str, info: WorkerInfo, model: Callable[[], str | None]) -> KvFollower | None:
        """A worker's Info came: fetch its model's tokenizer if the router has none yet, and
        return a new follower of its events if it streams them (its task is the caller's)."""
        if self.tokenizers is not None:
            # The router repeats vLLM 0.32's rendering; the mock renders with its tokenizer's template.
            version = info.engine_version if info.engine == "vllm" else None
            self.tokenizers.ensure(info.model, self._connect(address), engine_version=version)
        if info.takes_router_ids and info.tokenizer_digest and self.config.cache_tuning.send_prompt_ids:
            self._id_takers[address] = info.tokenizer_digest
        else:
            self._id_takers.pop(address, None)
        if not info.kv_events:
            if address not in self._told_no_events:
                # Workers relay no events unless started with --kv-events (vLLM builds them on its
                # engine's step): say once which worker routes on decisions alone, and the fix.
                self._told_no_events.add(address)
                logger.warning("worker %s relays no KV-cache events: cache_aware routes to it by its own recent "
                               "decisions and load only; start it with --kv-events (vllm-fleet node --kv-events, "
                               "or kv_events: true in a fleet file) to route by what its engine holds", address)
            return None
        self._told_no_events.discard(address)
        return self.follow(address, model, info.kv_block_size)

    def follow(self, address: str, model: Callable[[], str | None], block_size: int = 0) -> KvFollower | None:
        """A follower for a worker that streams events (its task is the caller's). `block_size`
        (the worker's Info) lets prompts be keyed before any event came."""
        name = model()
        if block_size and name:
            self._block_sizes.setdefault(name, block_size)
        if address in self.followers:
            return None
        follower = KvFollower(address, self._connect(address), self.index, model, on_change=self._on_change,
                              on_unsupported=lambda: self._unfollow(address, follower))
        self.followers[address] = follower
        return follower

    def _unfollow(self, address: str, follower: KvFollower) -> None:
        """Its stream says it has no events: what the index held of it is no longer known."""
        if self.followers.get(address) is follower:
            del self.followers[address]
            self.index.drop_worker(address)

    def forget(self, address: str) -> None:
        """The worker left the pool: its entries go with it."""
        self.followers.pop(address, None)
        self._predicted.pop(address, None)
        self._id_takers.pop(address, None)
        self.index.drop_worker(address)

    def fresh(self, address: str) -> bool:
        follower = self.followers.get(address)
        return follower is not None and follower.fresh

    def ready(self, snapshot) -> bool:
        """Every serving worker's events in step, and its model's tokenizer here (when fetched)
        or its fetch failed (then waiting longer would not help)."""
        serving = snapshot.eligible()
        if not serving:
            return False
        events = all(self.fresh(w.address) for w in serving)
        tokenizers = self.tokenizers is None or all(self.tokenizers.settled(w.model) for w in serving)
        return events and tokenizers

    def reuse(self, model: str) -> PrefixReuse:
        """Whether `model`'s new prompts come back. Each model has its own: a fleet's chat model may
        serve tenants' documents while another model's prompts share nothing, and one's unique
        prompts must not take the home from the other's."""
        reuse = self._reuse.get(model)
        if reuse is None:
            reuse = self._reuse.setdefault(model, PrefixReuse())  # routers key prompts on threads
        return reuse

    def stats(self) -> dict:
        """The index's counters and sizes, requests routed without ids or without a choice, each
        model's tokenizer here, per-worker predictions."""
        return {**dataclasses.asdict(self.index.counters), "entries": self.index.entries_per_worker(),
                "routed_without_ids": self.unknown_ids, "routed_without_choice": self.no_choice,
                "tokenizers": self.tokenizers.states() if self.tokenizers is not None else {},
                "prefix_reuse": {model: round(reuse.share, 3) for model, reuse in list(self._reuse.items())},
                "predicted_hit_rate": {a: self.predicted_hit_rate(a) for a in self._predicted},
                "copied_tokens": {a: totals[2] for a, totals in self._predicted.items()}}

    def describe(self, snapshot) -> str:
        return ", ".join(f"{w.address}: events {self.events_state(w.address)}, tokenizer "
                         f"{'ready' if self.tokenizers is not None and self.tokenizers.get(w.model) else 'not ready'}"
                         for w in snapshot.eligible()) or "no serving worker"

    def events_state(self, address: str) -> str:
        follower = self.followers.get(address)
        return "off" if follower is None else "in step" if follower.fresh else "stale"

    def predicted_hit_rate(self, address: str) -> float | None:
        predicted, routed, _ = self._predicted.get(address, (0, 0, 0))
        return predicted / routed if routed else None

    def copied_share(self, address: str) -> float | None:
        """Of the prompt tokens routed to `address`, the share another worker held more of."""
        _, routed, copied = self._predicted.get(address, (0, 0, 0))
        return copied / routed if routed else None

    # --- requests -----------------------------------------------------------------------

    def needs_tokenizing(self, request: GenerateRequest) -> bool:
        """Whether `match` would render and tokenize (worth a thread), not just read ids."""
        return request.inputs[0].token_ids is None and self.tokenizers is not None

    def prompt_ids(self, request: GenerateRequest, model: str | None, *,
                   head_chars: int = 0) -> list[int] | PartialIds | None:
        """The first input's token ids as the engine will see them, or None when not known now.
        `head_chars` > 0: a long new text may answer its leading ids first (PartialIds)."""
        item = request.inputs[0]
        if item.token_ids is not None:
            return list(item.token_ids)
        if self.tokenizers is None or model is None or item.resume_token_ids:
            return None
        if request.body.endpoint == "responses":
            return None  # Responses input items become messages by vLLM's conversion, on the worker only
        if request.body.endpoint == "messages":  # Anthropic's messages: only the worker converts them (vLLM)
            return None
        body = json.loads(request.body.body_json)
        if item.messages is not None:
            return self.tokenizers.ids_for(model, body, messages=item.messages, head_chars=head_chars)
        return self.tokenizers.ids_for(model, body, prompt=item.text or "", head_chars=head_chars)

    def match(self, request: GenerateRequest, features: RequestFeatures) -> tuple[RequestFeatures, CachePrompt]:
        """`features` with the prompt's token count, and the prompt as keyed with each worker's
        cached tokens of it (`CachePrompt.match`); unchanged features and an empty CachePrompt
        when the ids are not known (routed by load alone).

        A long new text is tokenized head first (`head_chars`, router/prompt/segments.py): when
        some block of the head is held by no worker, the lookup has already stopped there and the
        keys past it cannot change who holds what nor the frontier, so the rest is never
        tokenized for the decision. Then `block_keys` cover the head only, `prompt_tokens` is an
        estimate from the rest's characters (for weighing costs; the worker checks the context
        length), `ids_len` is 0 (no count to check against the engine's), and `rest_keys`
        computes the whole prompt's keys, which `routed` adds to the speculative entries off the
        decision path."""
        model = features.model or ""
        block_size = self.index.block_size(model) or self._block_sizes.get(model, 0)
        ids = self.prompt_ids(request, features.model, head_chars=self.head_chars) if block_size else None
        if ids is None:
            self.unknown_ids += 1
            return features, CachePrompt()
        lora, salt = request.adapter, cache_salt(request)
        if isinstance(ids, PartialIds):
            keys = block_keys(ids.head, block_size, lora=lora, salt=salt)
            held = self.index.matched_tokens(model, keys) if keys else {}
            if keys and max(held.values(), default=0) < len(keys) * block_size:
                features, match = self._matched(request, features, block_size, keys, held, ids.estimated_tokens)
                rest = lambda: block_keys(ids.complete(), block_size, lora=lora, salt=salt)  # noqa: E731
                return features, CachePrompt(tuple(keys), 0, rest_keys=rest, match=match)
            ids = ids.complete()   # every block of the head is held somewhere: the rest may match too
        keys = block_keys(ids, block_size, lora=lora, salt=salt)
        held = self.index.matched_tokens(model, keys) if keys else {}
        features, match = self._matched(request, features, block_size, keys, held, len(ids))
        rendered = self._id_takers and request.inputs[0].token_ids is None  # rendered here: a worker may skip it
        return features, CachePrompt(tuple(keys), len(ids), ids=tuple(ids) if rendered else None, match=match)

    def _matched(self, request: GenerateRequest, features: RequestFeatures, block_size: int, keys: list[int],
                 held: dict[str, int], tokens: int) -> tuple[RequestFeatures, CacheMatch]:
        prompt_tokens = features.prompt_tokens
        if len(request.inputs) == 1:  # exact now (or the head's estimate), for one input (the others stay estimates)
            prompt_tokens = tokens
        best = max(held.values(), default=0)
        held_blocks = best // block_size
        frontier = str(keys[min(held_blocks, len(keys) - 1)]) if keys else ""
        watch = self.reuse(features.model or "")
        reuse = watch.share  # of the prompts before this one: the decision stays a function of its inputs
        new_tokens = max(0, tokens - best)
        mostly_new = held_blocks < len(keys) and new_tokens >= best  # where the home decides
        watch.note(keys[:held_blocks], keys[held_blocks] if mostly_new else None, new_tokens)
        return (dataclasses.replace(features, prompt_tokens=prompt_tokens),
                CacheMatch(cached_tokens=held, frontier_key=frontier, prefix_reuse=reuse))

    def _key_rest(self, hold: RoutedHold, address: str, model: str, rest_keys: Callable[[], list[int]],
                  keyed: int) -> None:
        """Add the rest of a head-keyed prompt's blocks to its hold, on this router's keying thread.
        The decision needed only the head (no worker held all of it); the whole prompt's entries
        are what pulls the next request for the same new document (the next Spark row of a shared
        text, arriving before the engine's events) to where its prefill is going. One thread: the
        rest of a ~2,000-token text takes ~1-3 ms, far less than the event delay it covers."""
        def extend() -> None:
            if not hold.is_open:  # its attempt ended while this waited in the queue: nothing to add
                return
            try:
                self.index.extend_hold(hold, address, model, rest_keys()[keyed:])
            except Exception:  # a routing hint only: the request runs either way
                logger.exception("keying the rest of a prompt for %s failed", address)
        self._keying_executor().submit(extend)

    def _keying_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The one thread that keys and tokenizes off the decision path (made on first use)."""
        if self._keying is None:
            self._keying = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-keys")
        return self._keying

    def attempt_request(self, address: str, request: GenerateRequest, features: RequestFeatures,
                        prompt: CachePrompt) -> GenerateRequest:
        """`request` (an attempt's, input 0 the caller's own and not resumed) with the router's ids of
        input 0 on it when `address` takes router ids rendered with the files this router rendered with
        (the digests agree): the worker may then skip rendering the prompt (worker/router_ids.py). Set per
        attempt, on a copy: a retry elsewhere goes without them where that worker does not take them."""
        ids = prompt.ids
        digest = self._id_takers.get(address)
        if ids is None or digest is None or self.tokenizers is None or features.model is None:
            return request
        if digest != self.tokenizers.digest(features.model) or request.inputs[0].resume_token_ids:
            return request
        first = dataclasses.replace(request.inputs[0], router_token_ids=list(ids), router_ids_digest=digest)
        return dataclasses.replace(request, inputs=[first, *request.inputs[1:]])

    def wants_answer(self, request: GenerateRequest) -> bool:
        """Whether `answered` would use this request's answer: a chat request of one input and
        one sample, with messages the router renders itself."""
        item = request.inputs[0] if len(request.inputs) == 1 else None
        return (self.tokenizers is not None and item is not None and item.messages is not None
                and item.token_ids is None and request.n <= 1 and request.body.endpoint == "chat")

    def answered(self, request: GenerateRequest, features: RequestFeatures, prompt: CachePrompt,
                 answer: str | None) -> concurrent.futures.Future | None:
        """A chat request's answer reached the caller: its next turn will send it back as an
        assistant message, text the router never tokenized. Tokenize that turn's pieces now, on
        the keying thread, so the next decision finds the answer in the piece cache (a 100-token
        answer is ~0.1 ms of the decision otherwise). The future is for tests; None when nothing
        is done."""
        model = features.model
        if not answer or model is None or self.tokenizers is None or not (prompt.block_keys or prompt.ids_len):
            return None  # no ids were known for this prompt: its next turn will not have them either
        tokenizers, body = self.tokenizers, request.body.body_json
        messages = request.inputs[0].messages

        def warm() -> None:
            try:
                tokenizers.warm_next_turn(model, json.loads(body), messages, answer)
            except Exception:  # a cache warm-up only: the next turn tokenizes it then
                logger.exception("tokenizing the answer of %s for its next turn failed", request.request_id)
        try:
            return self._keying_executor().submit(warm)
        except RuntimeError:  # the router is closing
            return None

    def close(self, *, wait: bool = False) -> None:
        """Stop the keying thread; work queued on it finishes (`wait`: before this returns)."""
        if self._keying is not None:
            self._keying.shutdown(wait=wait)

    def routed(self, address: str, features: RequestFeatures, prompt: CachePrompt) -> RoutedHold | None:
        """A request went to `address`: count its prefix as held there until events confirm. The
        caller calls the hold's `first_token()` at the attempt's first token and `release()` when
        the attempt ends (None: the prompt's blocks are not known, nothing to hold)."""
        if not prompt.block_keys:
            return None
        model = features.model or ""
        hold = self.index.note_routed(address, model, list(prompt.block_keys),
                                      ttl_s=self.config.cache_tuning.speculative_ttl_s)
        if prompt.rest_keys is not None:
            self._key_rest(hold, address, model, prompt.rest_keys, len(prompt.block_keys))
        predicted = prompt.match.held(address) if self.fresh(address) else 0
        self._metrics.predicted_cached_tokens.labels(address).inc(predicted)
        self._metrics.routed_prompt_tokens.labels(address).inc(features.prompt_tokens)
        totals = self._predicted.setdefault(address, [0, 0, 0])
        totals[0] += predicted
        totals[1] += features.prompt_tokens
        # Tokens another worker holds that this one will prefill again (and then hold twice): the
        # price of a decision made for load. Counted so that a hit rate under the best possible
        # can be told apart from an index that misses blocks.
        best = max((held for other, held in prompt.match.cached_tokens.items() if self.fresh(other)), default=0)
        if best > predicted:
            copied = best - predicted
            totals[2] += copied
            self._metrics.copied_prompt_tokens.labels(address).inc(copied)
            logger.debug("routed to %s: prefills %d prompt tokens another worker holds (%d held there)",
                         address, copied, predicted)
        return hold
