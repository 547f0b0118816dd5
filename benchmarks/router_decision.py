"""The cache-aware router's whole decision for a ~2,000-token chat prompt, and what it is made of.

    PYTHONPATH=src python benchmarks/router_decision.py [--requests 300] [--fill-entries 500000] [--cases next-turn]

One decision is what the router does between a request arriving and a worker picked:
`features_of` (router.py), `CacheRouting.match` (parse the body, render the chat template,
tokenize, chain the block keys, look them up in the index) and the cache_aware policy ranking
8 workers. Everything is the router's real code, in this process: the tokenizer is the packaged
model's (SmolLM2), fetched through TokenizerCache from the files a worker's TokenizerFiles
sends; the index is filled through `CacheIndex.apply` with the events 8 engines of 16-token
blocks would send (`--fill-entries` entries of other prompts, then every routed prompt stored on
the worker picked, untimed, as its engine would). Render+tokenize, block keys and the index
lookup are timed by wrapping the functions the decision calls (~1 us added to the whole).

Three request shapes, each with the piece cache (router/prompt/segments.py) on and off:
  fresh      every prompt new text: a short system prompt and a ~1,950-token document of
             random words (new to the tokenizer's own word cache too: its worst case)
  shared     8 tenants' ~1,950-token system prompts (documents), each seen before, and a new
             ~40-token question (the llm-d "shared prefix" workload shape)
  next-turn  a conversation's next turn: the earlier turns (~1,800 tokens) were sent in the
             previous request, whose answer (~100 tokens) this router streamed back, so it
             tokenized the answer after it ended (CacheRouting.answered, untimed); new is the
             user's next message (~50 tokens)
  next-turn-unseen  the same, but the previous answer came through another router (or none
             was kept): the router tokenizes the answer in the decision

Each request is decided by both settings in turn, the order rotating, so both see the same
machine load. Wall-clock per decision (perf_counter), one thread, garbage collection on. The
machine is shared: a P99 includes other processes' scheduling.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from vllm_fleet.bench import percentile
from vllm_fleet.models import resolve_model
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.kv_events import BlocksStored, KvEventBatch
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol.tokenizer_files import FileAssembler
from vllm_fleet.router.cache import routing as cache_routing
from vllm_fleet.router.cache.block_keys import block_keys
from vllm_fleet.router.cache.routing import CacheRouting
from vllm_fleet.router.config import RouterConfig
from vllm_fleet.router.features import features_of
from vllm_fleet.router.policies import make_policy
from vllm_fleet.router.prompt.tokenizers import TokenizerCache
from vllm_fleet.router.prompt.segments import MAX_CHARS
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView
from vllm_fleet.worker.tokenizer_files import read_tokenizer_files

MODEL = "m"
BLOCK = 16
WORKERS = [f"10.0.0.{w}:50051" for w in range(8)]
CHARS_PER_TOKEN = 2.2   # of the random-word text below, in SmolLM2's tokenizer (the run prints the counts)


class FolderSource:
    """A worker's TokenizerFiles answer for a local model folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def tokenizer_files(self, dest_dir, *, timeout: float = 60.0) -> list[str]:
        files = FileAssembler(Path(dest_dir))
        for chunk in read_tokenizer_files(SimpleNamespace(tokenizer_source=str(self.folder), tokenizer_revision=None)):
            files.add(*chunk)
        files.finish()
        return sorted(p.name for p in Path(dest_dir).iterdir())


class Engines:
    """The 8 workers' engines as the index hears them: each routed prompt's full blocks stored."""

    def __init__(self, routing: CacheRouting) -> None:
        self.index = routing.index
        self.sequence = dict.fromkeys(WORKERS, 0)
        self.next_hash = 1
        for address in WORKERS:
            self.index.apply(address, KvEventBatch("e", 0, 0.0, (), snapshot=True, block_size=BLOCK), model=MODEL)

    def store(self, address: str, ids: list[int]) -> None:
        blocks = len(ids) // BLOCK
        if not blocks:
            return
        hashes = tuple((self.next_hash + i).to_bytes(8, "big") for i in range(blocks))
        self.next_hash += blocks
        self.sequence[address] += 1
        event = BlocksStored(hashes, None, tuple(ids[:blocks * BLOCK]), BLOCK)
        self.index.apply(address, KvEventBatch("e", self.sequence[address], 0.0, (event,)), model=MODEL)

    def fill(self, entries: int, rng: random.Random) -> None:
        """Other prompts of 64 blocks, spread over the workers (ids the chat prompts never have)."""
        for n in range(entries // 64 + 1):
            self.store(WORKERS[n % len(WORKERS)], [rng.randrange(49152, 1 << 31) for _ in range(64 * BLOCK)])


def word(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfghjklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(1, 4)))


def fresh_text(rng: random.Random, tokens: int) -> str:
    """About `tokens` tokens of new words in paragraphs, with some punctuation and numbers."""
    out, chars = [], 0
    while chars < tokens * CHARS_PER_TOKEN:
        piece = word(rng) + rng.choice(["", "", "", ",", "."]) + (f" {rng.randint(1, 9999)}" if rng.random() < 0.03 else "")
        if rng.random() < 0.02:
            piece += "\n\n"
        out.append(piece)
        chars += len(piece) + 1
    return " ".join(out)


def chat(request_id: str, messages: list[dict]):
    return build_request(request_id, [GenerateInput(messages=messages)], SamplingParams(max_tokens=128))


def fresh_requests(rng: random.Random, count: int) -> list[tuple[list[dict] | None, list[dict]]]:
    """(request sent before it, untimed; the timed request)."""
    return [(None, [{"role": "system", "content": "You are a careful assistant. " + word(rng)},
                    {"role": "user", "content": fresh_text(rng, 1950) + "\n\nSummarise the document."}], None)
            for _ in range(count)]


def shared_requests(rng: random.Random, count: int) -> list[tuple[list[dict] | None, list[dict]]]:
    documents = [{"role": "system", "content": "Answer from this document only.\n\n" + fresh_text(rng, 1950)}
                 for _ in range(8)]
    warm = [[doc, {"role": "user", "content": "What is it about?"}] for doc in documents]
    timed = [[documents[n % 8], {"role": "user", "content": fresh_text(rng, 40) + "?"}] for n in range(count)]
    return [(warm[n] if n < 8 else None, messages, None) for n, messages in enumerate(timed)]


def next_turn_requests(rng: random.Random, count: int, *, answer_seen: bool = True):
    """(the previous request, the timed next turn, the previous answer where this router saw it)."""
    out = []
    for _ in range(count):
        turns = [{"role": "system", "content": "You are a helpful assistant."}]
        while sum(len(m["content"]) for m in turns) < 1800 * CHARS_PER_TOKEN:
            turns += [{"role": "user", "content": fresh_text(rng, 50)},
                      {"role": "assistant", "content": fresh_text(rng, 200)}]
        previous = turns[:-1]                          # the last request: up to the user's message
        answer = {"role": "assistant", "content": fresh_text(rng, 100)}
        out.append((previous, previous + [answer, {"role": "user", "content": fresh_text(rng, 50)}],
                    answer["content"] if answer_seen else None))
    return out


class Timed:
    """Wraps a callable; keeps the seconds of its last call."""

    def __init__(self, fn) -> None:
        self.fn, self.last = fn, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.last = time.perf_counter() - start


def make_routing(folder: Path, piece_cache_chars: int, cache_dir: str) -> CacheRouting:
    tokenizers = TokenizerCache(cache_dir, piece_cache_chars=piece_cache_chars)

    async def load() -> None:
        task = tokenizers.ensure(MODEL, FolderSource(folder))
        assert task is not None and await task is not None, "tokenizer not loaded"

    asyncio.run(load())
    return CacheRouting(RouterConfig(policy="cache_aware"), connect=lambda address: None, metrics=None,
                        tokenizers=tokenizers)


class Setting:
    """One router (its own tokenizer, piece cache and index), deciding and timing the parts."""

    def __init__(self, routing: CacheRouting, engines: Engines, keys_fn: Timed) -> None:
        self.routing, self.engines, self.keys_fn = routing, engines, keys_fn
        self.config = RouterConfig(policy="cache_aware")
        self.policy = make_policy("cache_aware")
        self.ids_for = routing.tokenizers.ids_for = Timed(routing.tokenizers.ids_for)
        self.lookup = routing.index.matched_tokens = Timed(routing.index.matched_tokens)
        self.ticket = 0

    def decide(self, messages: list[dict], views: PoolSnapshot, answer: str | None = None) -> tuple[list[float], object]:
        """([whole, render+tokenize, block keys, index lookup] seconds, the request's features).
        `answer`: the request's answer reached the caller through this router (untimed)."""
        self.ticket += 1
        request = chat(f"r{self.ticket}", messages)
        config, admission = self.config, self.config.admission
        start = time.perf_counter()
        features = features_of(request, model=MODEL, prefix_chars=config.prefix_chars,
                               default_max_tokens=config.default_max_tokens,
                               long_prompt_tokens=admission.long_prompt_tokens, long_max_tokens=admission.long_max_tokens,
                               ticket=self.ticket)
        features, prompt = self.routing.match(request, features)
        worker = self.policy.rank(features, views, prompt.match)[0]
        parts = [time.perf_counter() - start, self.ids_for.last, self.keys_fn.last, self.lookup.last]
        self.engines.store(worker, self.routing.prompt_ids(request, MODEL))   # untimed: what its engine stores
        if answer is not None:
            done = self.routing.answered(request, features, prompt, answer)
            assert done is not None, "the router did not take the answer"
            done.result()
        return parts, features, prompt


def run_case(settings: dict[str, Setting], requests, rng: random.Random) -> dict[str, dict[str, list[float]]]:
    """Each request decided by every setting in turn, the order rotating (the same machine load)."""
    views = PoolSnapshot(tuple(WorkerView(a, model=MODEL, kv_events_fresh=True, outstanding_tokens=rng.randrange(6000))
                               for a in WORKERS))
    times = {name: {"whole": [], "tokenize": [], "keys": [], "lookup": [], "tokens": [], "hit": [], "head only": []} for name in settings}
    for before, _, answer in requests:   # requests seen before the timed ones (none for fresh text)
        if before is not None:
            for setting in settings.values():
                setting.decide(before, views, answer)
    gc.collect()                    # not the garbage of what came before
    order = list(settings)
    for _, messages, _ in requests:
        order = order[1:] + order[:1]
        for name in order:
            parts, features, prompt = settings[name].decide(messages, views)
            for key, seconds in zip(("whole", "tokenize", "keys", "lookup"), parts):
                times[name][key].append(seconds)
            # ids_len is 0 where only a head was tokenized (CacheRouting.match): its estimate
            times[name]["tokens"].append(prompt.ids_len or features.prompt_tokens)
            times[name]["head only"].append(not prompt.ids_len)
            times[name]["hit"].append(max(prompt.match.cached_tokens.values(), default=0))
    return times


def line(label: str, values: list[float]) -> str:
    us = [v * 1e6 for v in values]
    return (f"  {label:<16} P50 {percentile(us, 50):7.0f} us  P90 {percentile(us, 90):7.0f} us  "
            f"P99 {percentile(us, 99):7.0f} us  max {max(us):7.0f} us  over 1 ms: {sum(u > 1000 for u in us)}/{len(us)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="timed decisions per case and setting")
    parser.add_argument("--fill-entries", type=int, default=500_000, help="(worker, block) entries of other prompts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", default="fresh,shared,next-turn,next-turn-unseen",
                        help="comma-separated: fresh, shared, next-turn, next-turn-unseen")
    args = parser.parse_args()
    folder = Path(resolve_model(None, None).path)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"python {sys.version.split()[0]}; model {folder.name}; {len(WORKERS)} workers, block size {BLOCK}; "
          f"load average at start {' '.join(load)}")
    builders = {"fresh": fresh_requests, "shared": shared_requests, "next-turn": next_turn_requests,
                "next-turn-unseen": lambda rng, count: next_turn_requests(rng, count, answer_seen=False)}
    keys_fn = cache_routing.block_keys = Timed(block_keys)
    with tempfile.TemporaryDirectory() as tmp:
        settings = {}
        for name, chars in (("piece cache on", MAX_CHARS), ("piece cache off", 0)):
            routing = make_routing(folder, chars, tmp)
            engines = Engines(routing)
            started = time.perf_counter()
            engines.fill(args.fill_entries, random.Random(args.seed))
            print(f"{name}: index filled with {len(routing.index):,} entries in {time.perf_counter() - started:.1f} s")
            settings[name] = Setting(routing, engines, keys_fn)
            # Untimed: the thread's tokenizer copy (~0.1 s) and the template's compilation, once per router.
            settings[name].routing.prompt_ids(chat("warm-up", [{"role": "user", "content": "Hi"}]), MODEL)
        for case in args.cases.split(","):
            build = builders[case]
            rng = random.Random(f"{args.seed}-{case}")
            results = run_case(settings, build(rng, args.requests), rng)
            for name, times in results.items():
                tokens, hits = sorted(times["tokens"]), sorted(times["hit"])
                print(f"\n{case}, {name}: {len(tokens)} decisions, prompt {tokens[0]}-{tokens[-1]} tokens (median "
                      f"{tokens[len(tokens) // 2]}), best worker holds median {hits[len(hits) // 2]} tokens; "
                      f"{sum(times['head only'])} keyed from a head, their token count estimated")
                print(line("whole decision", times["whole"]))
                print(line("render+tokenize", times["tokenize"]))
                print(line("block keys", times["keys"]))
                print(line("index lookup", times["lookup"]))
        pieces = settings["piece cache on"].routing.tokenizers.get(MODEL).pieces
        print(f"\npiece cache at the end: {len(pieces.cache)} pieces, {pieces.cache.chars:,} chars "
              f"(bound {pieces.cache.max_chars:,}), hits {pieces.cache.hits:,}, misses {pieces.cache.misses:,}")
        with open("/proc/loadavg") as f:
            print(f"load average at the end {' '.join(f.read().split()[:3])}")
    cache_routing.block_keys = block_keys
    sys.stdout.flush()


if __name__ == "__main__":
    main()
