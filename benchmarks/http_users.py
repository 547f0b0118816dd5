"""The routing benchmark's users as OpenAI HTTP clients (cache_routing.py): SMG's gateway, or ours
with --through-gateway, measured the same way."""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp


async def run_user_http(session, url: str, model: str, turns: list[dict], args, results: dict, prompt_text) -> None:
    """cache_routing.run_user's conversation as OpenAI HTTP requests to a gateway that is not ours (SMG)."""
    loop = asyncio.get_running_loop()
    history = [turns[0]]
    for question in turns[1:]:
        history.append(question)
        body = {"model": model, "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        if args.completions:
            path, body["prompt"] = "/v1/completions", prompt_text(history)
        else:
            path, body["messages"] = "/v1/chat/completions", list(history)
        results["sent"].append(body.get("prompt") or list(history))
        started = loop.time()
        first = usage = None
        answer = []
        async with session.post(url + path, json=body) as reply:
            if reply.status != 200:
                raise RuntimeError(f"{url}{path} answered {reply.status}: {(await reply.text())[:500]}")
            async for line in reply.content:
                data = line.strip().removeprefix(b"data:").strip()
                if not data or data == b"[DONE]":
                    continue
                chunk = json.loads(data)
                for choice in chunk.get("choices") or []:
                    # A chat stream's first chunk may carry only the role: not output yet.
                    text = choice.get("text") if args.completions else (choice.get("delta") or {}).get("content")
                    if first is None and (text or choice.get("finish_reason") or args.completions):
                        first = loop.time() - started
                    answer.append(text or "")
                usage = chunk.get("usage") or usage
        if usage is None:
            raise RuntimeError(f"{url}{path} streamed no usage: output tokens unknown, the runs can't be compared")
        results["ttft"].append(first if first is not None else loop.time() - started)
        results["output_tokens"] += usage["completion_tokens"]
        results["prompt_tokens"] += usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        if details is not None:  # our gateway, like vLLM, leaves it out when nothing was cached
            results["cached_reported"] = True
            results["cached_tokens"] += details.get("cached_tokens") or 0
        history.append({"role": "assistant", "content": "".join(answer)})


async def wait_gateway_keys(url: str, model: str, probe_words: list[str], timeout: float = 120.0) -> None:
    """Until the gateway's router keys prompts (its tokenizer loaded, the workers' events followed),
    as the in-process run waits with Router.wait_cache_ready: a gateway routes by load alone until
    then, and never waits itself. Probed with one-token requests of their own text, which share
    nothing with the run's."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for probe in range(10**6):
            async with session.post(f"{url}/v1/completions", json={
                    # Several blocks long (128 tokens each on CPU): a prompt under one full block
                    # has no keys, and is never counted as keyed.
                    "model": model, "prompt": f"probe {probe} {time.time_ns()} " + " ".join(probe_words * 8),
                    "max_tokens": 1}) as reply:
                await reply.read()
            async with session.get(f"{url}/metrics") as reply:
                text = await reply.text()
            fresh = re.findall(r"kv_events_fresh\{[^}]*\} (\S+)", text)
            keyed = sum(float(v) for v in re.findall(r"routed_prompt_tokens_total\{[^}]*\} (\S+)", text))
            if keyed > 0 and fresh and all(float(v) == 1.0 for v in fresh):
                return
            if loop.time() >= deadline:
                raise RuntimeError(f"the gateway at {url} did not key prompts within {timeout:.0f}s")
            await asyncio.sleep(0.5)  # polling a condition with a deadline, not a synchronisation


async def gateway_copied_tokens(url: str) -> dict[str, float]:
    """Per worker, the prompt tokens the gateway's router sent there that another worker held more
    of (its copied_prompt_tokens counter): what its decisions for load cost in prefill."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.get(f"{url}/metrics") as reply:
            text = await reply.text()
    return {worker: float(value) for worker, value in
            re.findall(r'copied_prompt_tokens_total\{[^}]*worker="([^"]+)"[^}]*\} (\S+)', text)}
