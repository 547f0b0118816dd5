"""Plain dataclasses for everything that crosses the worker protocol.

Each crosses the wire unchanged (tests/protocol checks the round trip), within what the wire
holds: floats as 32 bits, integers within their proto widths, and the canonical forms below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclass(slots=True)
class ChatMessage:
    """One message of a conversation. The tool fields are empty unless the message has them."""

    role: str
    content: str
    name: str = ""
    tool_call_id: str = ""       # a tool message: the call it answers
    tool_calls_json: str = ""    # an assistant message: its tool calls, as OpenAI's JSON list
    reasoning: str = ""          # an assistant message: its reasoning, for templates that use it


@dataclass(slots=True)
class Constraint:
    """A structured-output constraint (vLLM's StructuredOutputsParams); exactly one field is set."""

    json_schema: str | None = None       # a JSON schema, as JSON text
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None           # EBNF
    structural_tag: str | None = None    # as JSON text

    @property
    def kind(self) -> str | None:
        for name in ("json_schema", "regex", "choice", "grammar", "structural_tag"):
            if getattr(self, name) is not None:
                return name
        return "json_object" if self.json_object else None


@dataclass(slots=True)
class SamplingParams:
    """vLLM's sampling parameters; None means the engine's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    n: int | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    bad_words: list[str] = field(default_factory=list)
    allowed_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = None
    constraint: Constraint | None = None


@dataclass(slots=True)
class OpenAIOptions:
    """An OpenAI request's fields for vLLM's own request model on the worker (gateway/fields.py
    says which); `endpoint` is "chat" or "completion". Messages and prompts travel as inputs."""

    endpoint: str
    body_json: bytes


@dataclass(slots=True)
class GenerateInput:
    """Exactly one of `text`, `messages`, `token_ids` is set.

    `resume_token_ids` are tokens already generated for this input elsewhere (migration):
    the worker continues after them and counts them against max_tokens.
    """

    text: str | None = None
    messages: list[ChatMessage] | None = None
    token_ids: list[int] | None = None
    resume_token_ids: list[int] = field(default_factory=list)
    # Characters of the resumed tokens' text the caller already has (None: all of it); the rest
    # was held back as a possible stop string, and the worker sends or matches it.
    resume_delivered_chars: int | None = None

    @property
    def kind(self) -> str:
        if self.messages is not None:
            return "chat"
        if self.token_ids is not None:
            return "token_ids"
        return "text"


@dataclass(slots=True)
class GenerateRequest:
    request_id: str
    inputs: list[GenerateInput]
    params: SamplingParams = field(default_factory=SamplingParams)
    session_id: str = ""
    priority: int = 0
    stream_interval_ms: int = 0
    openai: OpenAIOptions | None = None
    # Decoding follows a grammar (set by whoever builds an OpenAI request with one; a typed
    # `params.constraint` implies it): such a stream cannot resume elsewhere after its first token.
    constrained: bool = False
    adapter: str = ""          # a LoRA adapter to generate with; "" = the base model

    @property
    def grammar_constrained(self) -> bool:
        return self.constrained or self.params.constraint is not None


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


@dataclass(slots=True)
class Adapter:
    """A LoRA adapter a worker holds: requests name it as their model."""

    name: str
    path: str
    rank: int = 0
    base_model: str = ""
