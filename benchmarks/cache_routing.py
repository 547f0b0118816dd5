"""Routing policies side by side on workloads with and without shared prefixes: TTFT, output
tokens/s, and the engines' prefix-cache hits against the best the workload allows.

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/cache_routing.py --workers vllm \
        --workload shared-start --policies round_robin,least_outstanding,session_affinity,prefix_affinity,cache_aware

Two workers (gpu_pair.py): real vLLM engines on CPU cores 0 and 1 or on GPUs (`--cuda-devices`),
prefix caching on, the KV cache capped at `--kv-blocks` blocks so that one worker cannot hold
every prefix but the pair can; or mock engines with a simulated prefix cache of the same size
(`--workers mock`, for rehearsing the sequence; their times are a model, not an engine). Each
policy runs the same workload through one in-process Router, with its own salt so no run hits
another's cache.

On a GPU host, both workers on GPU 0, a model folder with random weights and
benchmarks/gpu/make_model.py's stand-in tokenizer (no chat template, hence --completions; it
knows only the words t<N>, hence --stand-in-words); benchmarks/gpu/pool_cache.sh shared sizes it:

    python benchmarks/cache_routing.py --cuda-devices 0,0 --model DIR --worker-arg=--load-format \
        --worker-arg=dummy --completions --stand-in-words --kv-blocks 1600 --tenants 24 --doc-words 1700

Workloads (chat, or with `--completions` each turn's messages joined into one prompt text; every
request's answer is `--max-tokens` long):
- shared-start: the llm-d shape scaled down. One system text every request starts with, then
  the tenant's document (`--tenants`, `--doc-words` each), then a user's question; users arrive
  as a Poisson process (`--rate` per second) and each asks `--turns` questions in turn, the
  history (answers included) resent each time. The tenants' documents together exceed one
  worker's KV cache and fit in the pair's. Hashing the prompt's first characters sends every
  request to one worker here; real cache knowledge splits tenants across both.
- prefix-repetition: vLLM's bench dataset of that name: `--tenants` prefixes of `--doc-words`
  words, each request one of them (uniform) plus a random suffix; single turn.
- unique: no two requests share more than the chat template's first tokens (with
  `--completions`: nothing).

Figures per policy: TTFT P50/P90/P99 (Router.stream() to the first chunk with tokens), the
routing decision's time (Router.stream() to the first worker picked: tokenizing, index lookup,
admission; RoutedStream.routed_at), output
tokens/s over the run, cached share = sum(usage.cached_tokens) / sum(usage.prompt_tokens), and
the best cached share the workload allows: each request's longest full-block prefix (the
workers' block size) shared with any earlier request (an unbounded cache that every request
reaches), computed from the prompts tokenized as the router does.

`smg_cache_aware` in --policies: SMG's `smg launch --policy cache_aware` over two vLLM engines
under vLLM's own gRPC launcher with our pair's engine settings (smg_pair.py; run
benchmarks/smg/install.sh first), after our pair has stopped. The same users, texts and arrival
times, sent as OpenAI HTTP requests (/v1/completions or /v1/chat/completions, streamed, usage
included); TTFT is the first chunk that carries output. Its cached share is what its responses'
usage reports (`prompt_tokens_details.cached_tokens`), n/a when they report none; its routing
decision's time is not visible from outside (n/a).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import zlib

from gpu_pair import add_worker_options, cache_pair, tokenizer_folder
from http_users import gateway_copied_tokens, run_user_http, wait_gateway_keys
from policy_variants import our_policy
from smg_pair import SMG_SYSTEMS, add_smg_options, served_name, smg_running
from vllm_fleet.bench import percentile
from vllm_fleet.models import resolve_model
from vllm_fleet.processes import GatewayProcess
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.cache.block_keys import block_keys
from vllm_fleet.router.prompt.tokenizers import PromptTokenizer

WORDS = ("river mountain city forest ocean desert island volcano glacier lake valley canyon harbor bridge "
         "market castle garden library museum station tower village meadow orchard vineyard quarry mill "
         "engine signal ledger invoice contract tenant policy clause schedule payment balance account "
         "report summary figure table chart record archive").split()
SYSTEM = ("You are the support assistant of a document service. Answer from the document below, in one "
          "sentence, and say so when the document does not contain the answer. ") * 6
QUESTIONS = ("What does the document say about {w}?", "Summarise the part on {w}.", "Is {w} mentioned twice?",
             "Which clause covers {w}?", "List what relates to {w}.")


# Where --stand-in-words spells words: t<N> for N in [1000, 101000), inside the vocabulary of every
# model config in benchmarks/gpu/configs (the smallest has 151,936 tokens).
STAND_IN_FIRST, STAND_IN_IDS = 1000, 100_000


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def stand_in(text: str) -> str:
    """`text` with every word spelled t<N>, N from the word's CRC32: make_model.py's stand-in
    tokenizer reads t<N> as token N and any other word as one unknown token, which would make
    every document, salt and question the same tokens. Distinct words stay distinct tokens (bar
    rare collisions), one token each."""
    return " ".join(f"t{STAND_IN_FIRST + zlib.crc32(w.encode()) % STAND_IN_IDS}" for w in text.split())


def prompt_text(history: list[dict]) -> str:
    """The conversation so far as one completion prompt: every message's text in order, so each
    turn resends the history (answers included) as a chat request does."""
    return "\n\n".join(message["content"] for message in history)


class Workload:
    """The requests of one run: a list of users, each a list of turns (first message lists)."""

    def __init__(self, kind: str, args: argparse.Namespace, salt: str) -> None:
        rng = random.Random(f"{args.seed}-{kind}")  # same texts for every policy; the salt differs
        spell = stand_in if args.stand_in_words else str
        self.kind = kind
        self.users: list[list[dict]] = []
        docs = [f"[{salt} doc {t}] " + words(rng, args.doc_words) for t in range(args.tenants)]
        for user in range(args.users):
            if kind == "shared-start":
                tenant = rng.randrange(args.tenants)
                # The salt first: the system text every request starts with is this run's own too.
                system = f"[{salt}] {SYSTEM}\n\nDocument:\n{docs[tenant]}"
                turns = args.turns
            elif kind == "prefix-repetition":
                system = docs[rng.randrange(args.tenants)]
                turns = 1
            else:  # unique: the salt and user number first, so nothing beyond the template is shared
                system = f"[{salt} user {user}] " + words(rng, args.doc_words)
                turns = 1
            questions = [rng.choice(QUESTIONS).format(w=rng.choice(WORDS)) + " " + words(rng, args.question_words)
                         for _ in range(turns)]
            self.users.append([{"role": "system", "content": spell(system)},
                               *({"role": "user", "content": spell(q)} for q in questions)])


async def run_user(router: Router, turns: list[dict], user: int, args, salt: str, results: dict) -> None:
    loop = asyncio.get_running_loop()
    history = [turns[0]]
    for turn, question in enumerate(turns[1:]):
        history.append(question)
        item = GenerateInput(text=prompt_text(history)) if args.completions else GenerateInput(messages=list(history))
        request = build_request(f"{salt}-u{user}-t{turn}", [item],
                                SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True),
                                session_id=f"{salt}-user-{user}")
        results["sent"].append(item.text if args.completions else list(history))
        started = loop.time()
        first = None
        answer = []
        async with router.stream(request) as stream:
            async for chunk in stream:
                if first is None and chunk.token_ids:
                    first = loop.time() - started
                answer.append(chunk.text)
                results["output_tokens"] += len(chunk.token_ids)
                if chunk.usage is not None:
                    results["prompt_tokens"] += chunk.usage.prompt_tokens
                    results["cached_tokens"] += chunk.usage.cached_tokens
        results["ttft"].append(first if first is not None else loop.time() - started)
        if stream.routed_at is not None:
            results["decide"].append(stream.routed_at - started)
        results["retried"] += stream.attempts - 1
        history.append({"role": "assistant", "content": "".join(answer)})


async def run_smg_policy(system: str, model_path: str, workload_kind: str, block_size: int, args) -> dict:
    """SMG's run of the workload: its own engines (smg_pair.py), the users over HTTP."""
    async with smg_running(system, model_path, args) as url:
        return await run_over_http(system, url, served_name(args), workload_kind, block_size, args)


async def run_over_http(system: str, url: str, model: str, workload_kind: str, block_size: int, args) -> dict:
    """The workload's users as OpenAI HTTP clients of the gateway at `url` (SMG's, or ours with
    --through-gateway): both sides measured the same way."""
    import aiohttp

    workload = Workload(workload_kind, args, f"{system}-{time.time_ns() % 100000}")
    results = new_results(over_http=True)
    # No pool limit (aiohttp's default is 100 connections): a user waiting for a connection
    # would count the wait as TTFT, a queue no gateway has.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        wall = await arrive(workload, lambda turns, user: run_user_http(session, url, model, turns, args, results, prompt_text), args)
    return summarize(system, workload_kind, results, wall, block_size, args, stats=None)


async def run_gateway_policy(policy: str, addresses: list[str], model: str, workload_kind: str, block_size: int,
                             args) -> dict:
    """One policy through a `vllm-fleet gateway` process in front of the pair, over HTTP as SMG is
    measured: the router out of the bench client's process, behind the same HTTP hop as SMG's."""
    name, _, gateway_args = our_policy(policy)
    gateway = GatewayProcess(["--workers", ",".join(addresses), "--policy", name, *gateway_args, "--no-access-log",
                              "--prefix-chars", str(args.prefix_chars), "--cache-home-tokens", str(args.cache_home_tokens),
                              "--stall-timeout-s", str(args.stall_timeout_s)],
                             {"VLLM_FLEET_LOG_LEVEL": "WARNING"}, log_path=f"/tmp/cache-bench-gateway-{policy}.log")
    async with gateway:
        await gateway.wait_ready(120)
        if name == "cache_aware":
            await wait_gateway_keys(gateway.url, model, WORDS)
            before = await gateway_copied_tokens(gateway.url)  # the probes' own
        result = await run_over_http(policy, gateway.url, model, workload_kind, block_size, args)
        if name == "cache_aware":
            after = await gateway_copied_tokens(gateway.url)
            result["router"] = {"copied_tokens": {w: v - before.get(w, 0.0) for w, v in after.items()}}
        return result


def new_results(*, over_http: bool = False) -> dict:
    """A run's tallies; over HTTP the cached share is known only if some response reports it."""
    results = {"ttft": [], "output_tokens": 0, "prompt_tokens": 0, "cached_tokens": 0, "retried": 0, "sent": [],
               "decide": []}
    if over_http:
        results["cached_reported"] = False
    return results


async def arrive(workload: Workload, run_user_task, args) -> float:
    """Every user started at Poisson arrival times (the same for every policy: a fixed seed),
    each as its own task; the wall time until the last one is answered."""
    rng = random.Random(args.seed)
    tasks = []
    started = time.perf_counter()
    for user, turns in enumerate(workload.users):
        tasks.append(asyncio.create_task(run_user_task(turns, user)))
        await asyncio.sleep(rng.expovariate(args.rate))
    await asyncio.gather(*tasks)
    return time.perf_counter() - started


async def run_policy(policy: str, addresses: list[str], workload_kind: str, block_size: int, args) -> dict:
    """One policy's run; `block_size`: the workers' KV block, in tokens (for the best cached share)."""
    salt = f"{policy}-{time.time_ns() % 100000}"
    workload = Workload(workload_kind, args, salt)
    name, settings, _ = our_policy(policy)
    router = Router(StaticRegistry.from_spec(addresses), RouterConfig(
        policy=name, prefix_chars=args.prefix_chars, cache_home_tokens=args.cache_home_tokens,
        stall_timeout_s=args.stall_timeout_s, **settings))
    await router.start()
    results = new_results()
    try:
        await router.wait_ready(timeout=120)
        await router.wait_cache_ready(timeout=120)
        wall = await arrive(workload, lambda turns, user: run_user(router, turns, user, args, salt, results), args)
        stats = router.cache_stats()
    finally:
        await router.close()
    return summarize(policy, workload_kind, results, wall, block_size, args, stats=stats)


def summarize(policy: str, workload_kind: str, results: dict, wall: float, block_size: int, args, stats) -> dict:
    ttft = results["ttft"]
    best = best_cached_share(results["sent"], block_size, tokenizer_folder(args))
    cached = results["cached_tokens"] / max(1, results["prompt_tokens"]) if results.get("cached_reported", True) else None
    decide = {p: round(percentile(results["decide"], p) * 1000, 1) for p in (50, 99, 100)} if results["decide"] else None
    return {
        "best_cached_share": best, "policy": policy, "workload": workload_kind, "requests": len(ttft), "wall_s": wall,
        "retried": results["retried"], "output_tokens": results["output_tokens"],
        "output_tok_s": results["output_tokens"] / wall, "prompt_tokens": results["prompt_tokens"],
        "cached_share": cached,
        "ttft_p50_ms": percentile(ttft, 50) * 1000, "ttft_p90_ms": percentile(ttft, 90) * 1000,
        "ttft_p99_ms": percentile(ttft, 99) * 1000, "router": stats, "decide_ms": decide,
    }


def best_cached_share(sent: list[list[dict] | str], block_size: int, tokenizer_folder: str) -> float:
    """The cached share an unbounded cache reached by every request would give: each prompt's
    longest full-block prefix shared with any prompt sent before it (in send order)."""
    tokenizer = PromptTokenizer.load(tokenizer_folder)
    seen: set[int] = set()
    cacheable = total = 0
    for messages in sent:
        ids = tokenizer.completion_ids(messages) if isinstance(messages, str) else tokenizer.chat_ids(messages)
        keys = block_keys(ids, block_size)
        held = 0
        while held < len(keys) and keys[held] in seen:
            held += 1
        cacheable += held * block_size
        total += len(ids)
        seen.update(keys)
    return cacheable / total if total else 0.0


async def main(args: argparse.Namespace) -> None:
    policies = args.policies.split(",")
    ours = [p for p in policies if p not in SMG_SYSTEMS]
    smg = [p for p in policies if p in SMG_SYSTEMS]
    if args.through_gateway and (internal := [p for p in ours if our_policy(p)[2] is None]):
        raise SystemExit(f"{', '.join(internal)}: change cache_aware's internal constants (router/cache/tuning.py), "
                         "which a gateway process does not take; run them without --through-gateway")
    results: dict[float, list[dict]] = {rate: [] for rate in rates(args)}
    block_size = 16 if args.cuda_devices else 128  # vLLM's block on a GPU and on CPU, until a worker says
    if ours:
        async with cache_pair(args) as (addresses, info):
            block_size = info.kv_block_size
            print(f"workers: {args.workers} {addresses} model={info.model} block_size={info.kv_block_size} "
                  f"kv_events={info.kv_events} kv_blocks={args.kv_blocks} (= {args.kv_blocks * info.kv_block_size} "
                  f"tokens each)", flush=True)
            for rate in results:
                args.rate = rate
                print_workload(args)
                for policy in ours:
                    if args.through_gateway:
                        run = run_gateway_policy(policy, addresses, info.model, args.workload, block_size, args)
                    else:
                        run = run_policy(policy, addresses, args.workload, block_size, args)
                    results[rate].append(await run)
                    print(json.dumps(results[rate][-1]), flush=True)
    for system in smg:  # its own engines (vLLM's gRPC launcher), started after ours are gone
        for rate in results:
            args.rate = rate
            print_workload(args)
            model_path = args.model or resolve_model(None, None).path
            results[rate].append(await run_smg_policy(system, model_path, args.workload, block_size, args))
            print(json.dumps(results[rate][-1]), flush=True)
    for rate, runs in results.items():
        print(f"\nrate {rate} users/s:")
        report(runs)


def print_workload(args: argparse.Namespace) -> None:
    print(f"workload: {args.workload}, {args.users} users, {args.tenants} tenants x {args.doc_words} words, "
          f"{args.turns} turns, Poisson {args.rate}/s, max_tokens {args.max_tokens}", flush=True)


def rates(args: argparse.Namespace) -> list[float]:
    return [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]


def report(results: list[dict]) -> None:
    # Same arrivals and texts for every policy; the answers must be the same length too, or the
    # tok/s ratios compare different work.
    counts = {r["policy"]: (r["requests"], r["output_tokens"]) for r in results}
    assert len(set(counts.values())) == 1, f"policies did different work: {counts}"
    print()
    print("| policy | requests | TTFT P50 | TTFT P90 | TTFT P99 | output tok/s | cached share | best possible | retried "
          "| decision P50 / P99 / max |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        cached = "n/a" if r["cached_share"] is None else f"{r['cached_share']:.1%}"
        decide = "n/a" if r["decide_ms"] is None else " / ".join(str(r["decide_ms"][p]) for p in (50, 99, 100)) + " ms"
        print(f"| {r['policy']} | {r['requests']} | {r['ttft_p50_ms']:.0f} ms | {r['ttft_p90_ms']:.0f} ms | "
              f"{r['ttft_p99_ms']:.0f} ms | {r['output_tok_s']:.1f} | {cached} | "
              f"{r['best_cached_share']:.1%} | {r['retried']} | {decide} |")
    print_ratios(results, cached_of_possible=lambda r: (r["cached_share"] or 0.0) / max(1e-9, r["best_cached_share"]),
                 output_tokens=lambda r: r["output_tokens"])
    for r in results:  # what the router's decisions for load cost: prefixes prefilled where another held them
        copied = (r["router"] or {}).get("copied_tokens")
        if copied is not None:
            total = sum(copied.values())
            print(f"{r['policy']}: sent {total:.0f} prompt tokens ({total / max(1, r['prompt_tokens']):.2%}) to a worker "
                  f"while another held more of them (per worker: {', '.join(f'{w} {v:.0f}' for w, v in copied.items())})")
    print(flush=True)


def print_ratios(results: list[dict], *, cached_of_possible, output_tokens,
                 bases: tuple[str, ...] = ("round_robin", "cache_aware")) -> None:
    """Each policy against each base policy that ran (round robin; our cache_aware, beside SMG's):
    P90 TTFT, output tok/s, and cached share of possible."""
    for base in (r for name in bases for r in results if r["policy"] == name):
        label = base["policy"].replace("_", " ")
        for r in results:
            print(f"{r['policy']}: P90 TTFT {r['ttft_p90_ms'] / base['ttft_p90_ms']:.2f}x {label}, "
                  f"output tok/s {r['output_tok_s'] / base['output_tok_s']:.2f}x, cached share "
                  f"{cached_of_possible(r):.2f}x of possible; output tokens {output_tokens(r)}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("shared-start", "prefix-repetition", "unique"), default="shared-start")
    parser.add_argument("--policies", default="round_robin,least_outstanding,session_affinity,prefix_affinity,cache_aware")
    parser.add_argument("--users", type=int, default=48)
    parser.add_argument("--tenants", type=int, default=12)
    parser.add_argument("--doc-words", type=int, default=900)
    parser.add_argument("--question-words", type=int, default=12)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--rate", type=float, default=1.0, help="Users arriving per second (Poisson)")
    parser.add_argument("--rates", default="", help="Several rates, comma-separated, each run for every policy on "
                        "the same workers (a calibration; overrides --rate)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=96, help="KV-cache blocks per worker")
    parser.add_argument("--completions", action="store_true",
                        help="send each turn as one prompt text, the messages so far joined (vllm bench's "
                             "completions; for models without a chat template), not chat messages")
    parser.add_argument("--stand-in-words", action="store_true",
                        help="spell every word of the prompts t<N>, the only words benchmarks/gpu/make_model.py's "
                             "stand-in tokenizer tells apart")
    parser.add_argument("--prefix-chars", type=int, default=256)
    parser.add_argument("--cache-home-tokens", type=int, default=512,
                        help="cache_aware: --cache-home-tokens (0: a miss goes to the least loaded worker)")
    parser.add_argument("--through-gateway", action="store_true",
                        help="our policies through a `vllm-fleet gateway` process, the users over HTTP as SMG's are "
                             "(default: an in-process Router, which shows the router's decision time)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--stall-timeout-s", type=float, default=60.0,
                        help="The router's stall watchdog; long, so a busy one-core engine's slow prefill is not "
                        "taken for a stall and retried elsewhere (a retry doubles the work and blurs the comparison)")
    add_worker_options(parser)
    add_smg_options(parser)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
