"""Any OpenAI-compatible HTTP server: our gateway, stock `vllm serve`, nginx in front of it, ...

Text prompts go to /v1/completions, chat messages to /v1/chat/completions, always streaming
(SSE). With `--prompt-format tokens`, random prompts go as token-id arrays (OpenAI's `prompt`
accepts them), for models whose tokenizer would not map the bench's words to distinct tokens.
The session id travels as OpenAI's `user` field. Output tokens come from the final
usage (`stream_options.include_usage`) when the server sends it, else from the chunk count
(which undercounts a server that packs several tokens into one event: with `ignore_eos` such
answers would be reported as short, so compare only servers that send usage).

The client is aiohttp, whose HTTP parser is C: at ~10,000 SSE events/s (one H200 at
saturation) a load generator built on httpx's pure-Python parser used a whole core and became
what the bench measured (benchmarks/RESULTS.md, "GPU (H200)"); aiohttp costs ~2.3x less per event.
"""

from __future__ import annotations

import json

import aiohttp

from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.targets.base import Clock, Target, TargetError
from vllm_fleet.bench.workloads import BenchItem
from vllm_fleet.errors import ConfigError


class HttpTarget(Target):
    name = "http"

    def __init__(self, base_url: str, config: BenchConfig) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.config = config
        self.model = config.model
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        # The runner bounds each request (--request-timeout); here only connecting is bounded.
        timeout = aiohttp.ClientTimeout(total=None, connect=10.0)
        # No connection cap: an open-loop bench must not queue requests inside the client.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        # read_bufsize: an SSE line must fit the reader's buffer (events with logprobs are long).
        self._session = aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector,
                                              read_bufsize=4 * 1024 * 1024)
        if self.model is None:
            self.model = await self._first_model()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _first_model(self) -> str:
        try:
            async with self._session.get(self.base_url + "/v1/models") as reply:
                reply.raise_for_status()
                models = (await reply.json(content_type=None)).get("data") or []
        except (aiohttp.ClientError, ValueError) as exc:
            raise ConfigError(f"cannot list models at {self.base_url}/v1/models ({exc}); pass --model") from None
        if not models:
            raise ConfigError(f"{self.base_url}/v1/models lists no model; pass --model")
        return models[0]["id"]

    def body(self, item: BenchItem) -> tuple[str, dict]:
        body: dict = {
            "model": self.model,
            "max_tokens": item.max_tokens,
            "temperature": self.config.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.config.ignore_eos:
            body["ignore_eos"] = True  # vLLM's extension; servers without it may ignore it
        if item.session_id:
            body["user"] = item.session_id
        if item.messages is not None:
            body["messages"] = item.messages
            return "/v1/chat/completions", body
        if item.token_ids is not None and self.config.prompt_format == "tokens":
            body["prompt"] = list(item.token_ids)
        else:
            body["prompt"] = item.prompt
        return "/v1/completions", body

    def describe(self) -> str:
        return f"OpenAI HTTP {self.base_url} (model {self.model})"

    async def send(self, item: BenchItem, record: RequestRecord, clock: Clock) -> None:
        path, body = self.body(item)
        headers = {"X-Request-Id": record.request_id}
        async with self._session.post(self.base_url + path, json=body, headers=headers) as response:
            if response.status != 200:
                text = (await response.read()).decode("utf-8", "replace")[:300]
                raise TargetError(f"http_{response.status}", text)
            usage_tokens = await self._read_events(response, record, clock)
        settle_token_counts(record, usage_tokens)

    async def _read_events(self, response: aiohttp.ClientResponse, record: RequestRecord,
                           clock: Clock) -> int | None:
        usage_tokens = None
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = clock()
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                raise TargetError("bad_stream", f"not JSON in SSE data: {data[:100].decode('utf-8', 'replace')!r}") from None
            if "error" in event:
                error = event["error"]
                raise TargetError("stream_error", str(error.get("message") if isinstance(error, dict) else error))
            if has_output(event):
                record.chunk_times.append(now)
                record.chunk_tokens.append(1)
            usage = event.get("usage")
            if usage:
                usage_tokens = usage.get("completion_tokens")
                record.prompt_tokens = usage.get("prompt_tokens") or 0
        return usage_tokens


def has_output(event: dict) -> bool:
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        if choice.get("text") or (isinstance(delta, dict) and delta.get("content")):
            return True
    return False


def settle_token_counts(record: RequestRecord, usage_tokens: int | None) -> None:
    """Output tokens = usage when given, else chunks. When usage says more tokens than chunks
    arrived (the server coalesced), spread them over the chunks so ITL stays per token."""
    chunks = len(record.chunk_times)
    if not usage_tokens:
        record.output_tokens = chunks
        return
    record.output_tokens = usage_tokens
    if chunks and usage_tokens > chunks:
        base, extra = divmod(usage_tokens, chunks)
        record.chunk_tokens = [base + (1 if i < extra else 0) for i in range(chunks)]
