"""Plain dataclasses for everything that crosses the worker protocol.

Each crosses the wire unchanged (tests/protocol checks the round trip), within what the wire
holds: floats as 32 bits, integers within their proto widths, and the canonical forms below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")
# The request form of this release (WorkerInfo.request_form): an envelope plus vLLM's body.
REQUEST_FORM = 2


@dataclass(slots=True)
class ChatMessage:
    """A typed chat message for the Python client and Spark: `to_openai()` is what travels (an
    OpenAI message dict). The tool fields are empty unless the message has them."""

    role: str
    content: str | None
    name: str = ""
    tool_call_id: str = ""                   # a tool message: the call it answers
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # an assistant message: OpenAI's list
    reasoning: str = ""                      # an assistant message: its reasoning, for templates that use it

    def to_openai(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name:
            message["name"] = self.name
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = list(self.tool_calls)
        if self.reasoning:
            message["reasoning"] = self.reasoning
        return message


def content_text(content: Any) -> str:
    """An OpenAI message's content as text: text parts joined with newlines, as vLLM's chat
    renderer joins them (other parts have no text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") if isinstance(part, dict) else getattr(part, "text", "") for part in content)


@dataclass(slots=True)
class RequestBody:
    """The request body in vLLM's OpenAI shape, as JSON: the only carrier of sampling meaning.

    `endpoint` names the vLLM request model that reads it: "chat" (ChatCompletionRequest) or
    "completion" (CompletionRequest). It never holds what the envelope carries (messages, prompt,
    n, priority): the worker puts those in from the envelope. Build one from typed parameters with
    `vllm_fleet.protocol.sampling`; the gateway forwards the client's fields as they came.
    """

    endpoint: str
    body_json: bytes = b"{}"


@dataclass(slots=True)
class RoutingHints:
    """What a router may use to place a request; never a meaning.

    `max_tokens` is the answer length the request asks for per sample (None: unknown), for the
    cost estimate and the short/long workload class. `service_class` says who waits for whom; it
    alone travels to the worker (`GenerateRequest.batch`), which leaves batch out of the
    interactive latency it reports in its Load.
    """

    max_tokens: int | None = None
    # "interactive" (the default) or "batch": batch runs in the capacity interactive work leaves
    # idle and steps aside for it (router/classes/service_class.py).
    service_class: str = "interactive"


@dataclass(slots=True)
class GenerateInput:
    """Exactly one of `text`, `messages` (OpenAI message dicts), `token_ids` is set.

    `resume_token_ids` are tokens already generated for this input elsewhere (migration):
    the worker continues after them and counts them against max_tokens.
    """

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    resume_token_ids: list[int] = field(default_factory=list)
    # Characters of the resumed tokens' text the caller already has (None: all of it); the rest
    # was held back as a possible stop string, and the worker sends or matches it.
    resume_delivered_chars: int | None = None
    # The router's own rendering of this text/messages prompt (token ids), and the digest of the
    # tokenizer files it rendered with (WorkerInfo.tokenizer_digest): a worker that takes them may
    # run them instead of rendering (worker/router_ids.py). None: the worker renders.
    router_token_ids: list[int] | None = None
    router_ids_digest: str = ""

    def __post_init__(self) -> None:
        if self.messages is not None:  # typed messages (the Python client, Spark) travel as OpenAI dicts
            self.messages = [m.to_openai() if isinstance(m, ChatMessage) else m for m in self.messages]

    @property
    def kind(self) -> str:
        if self.messages is not None:
            return "chat"
        if self.token_ids is not None:
            return "token_ids"
        return "text"


@dataclass(slots=True)
class GenerateRequest:
    """One request: the envelope the fleet owns and may rewrite, and the body vLLM gives meaning to
    (see the top of worker.proto for the split)."""

    request_id: str
    inputs: list[GenerateInput]
    body: RequestBody
    n: int = 1                 # samples per input, as the fleet schedules them
    session_id: str = ""
    priority: int = 0
    stream_interval_ms: int = 0
    # Decoding follows a grammar: such a stream cannot resume elsewhere after its first token.
    constrained: bool = False
    adapter: str = ""          # a LoRA adapter to generate with; "" = the base model
    hints: RoutingHints = field(default_factory=RoutingHints)  # the router's; only the class is on the wire


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass(slots=True)
class PromptLogprob:
    """One prompt token's logprobs (vLLM's prompt_logprobs). The prompt's first token has none:
    `logprob` is None and `candidates` empty. `candidates` are (token id, decoded token, logprob,
    rank) in vLLM's order: the prompt token first, then the top alternatives by rank."""

    token_id: int
    token: str
    logprob: float | None
    candidates: list[tuple[int, str, float, int]] = field(default_factory=list)


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of one tool call: `id` and `name` come on the call's first delta."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class Chunk:
    """A delta of one (input index, sample) stream. `usage` is set on its final chunk.

    `finish_reason`, `stop_reason`, `logprobs` and `tool_calls` are None when absent, never
    empty: the wire cannot tell an empty value from an absent one, and reads both back as None.
    With tool/reasoning parsing `text` is the content, and `finish_reason` is already vLLM's ("tool_calls" once
    a tool call was streamed and the model stopped, except for a named tool_choice, which stays "stop").
    """

    index: int
    sample: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    usage: Usage | None = None
    logprobs: list[TokenLogprob] | None = None
    stop_reason: str | None = None
    reasoning: str = ""                          # reasoning delta; `text` is the content
    tool_calls: list[ToolCallDelta] | None = None
    prompt_text: str | None = None               # echo: the prompt, on a stream's first chunk
    prompt_logprobs: list[PromptLogprob] | None = None  # one per prompt token, on a stream's first chunk

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class WorkerInfo:
    model: str
    max_model_len: int
    engine: str
    version: str = ""
    engine_version: str = ""
    settings: dict[str, str] = field(default_factory=dict)
    device: str = ""
    worker_id: str = ""
    pool: str = ""             # the workload pool it serves (e.g. short | long); "" = any
    request_form: int = REQUEST_FORM  # the request form it reads; routers use only workers of theirs
    kv_block_size: int = 0     # tokens per KV-cache block; 0 = unknown
    kv_events: bool = False    # KvEvents streams this engine's cache events
    tasks: list[str] = field(default_factory=list)  # vLLM's supported tasks; [] = generate (the mock)
    pooling_endpoints: list[str] = field(default_factory=list)  # what Pool takes (pooling.py); [] = none
    tokenizer_digest: str = ""  # of the files TokenizerFiles sends (protocol/tokenizer_files.py); "" = none
    takes_router_ids: bool = False  # runs a router's prompt ids rendered with those files

    @property
    def generates(self) -> bool:
        """Serves generation (chat, completions): a worker that says no tasks (the mock) does."""
        return not self.tasks or "generate" in self.tasks


@dataclass(slots=True)
class WorkerLoad:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_hit_rate: float = 0.0
    output_tokens_per_s: float = 0.0
    in_flight: int = 0
    draining: bool = False
    adapters: list[str] = field(default_factory=list)  # LoRA adapters loaded now
    max_adapters: int = 0                               # adapter slots; 0 = LoRA off
    health: str = ""                                    # gRPC health status name; "" from older workers
    prefix_cache_queries: int = 0                       # the engine's own counters, lifetime tokens
    prefix_cache_hits: int = 0
    interactive_ttft_p90_ms: float = 0.0                # recent interactive latency; 0 = none lately
    interactive_itl_p90_ms: float = 0.0
    interactive_ttft_p90_floor_ms: float = 0.0          # their lower confidence bounds (what routers judge)
    interactive_itl_p90_floor_ms: float = 0.0
    interactive_ttft_baseline_ms: float = 0.0           # P90s without any batch here; 0 = not learnt
    interactive_itl_baseline_ms: float = 0.0
    engine_silent_s: float = 0.0                        # the engine holds requests and shows no progress; 0 = stepping


@dataclass(slots=True)
class Adapter:
    """A LoRA adapter a worker holds: requests name it as their model."""

    name: str
    path: str
    rank: int = 0
    base_model: str = ""
