"""Request bodies of the OpenAI endpoints, as pydantic models.

They do two jobs: validate what the gateway itself reads (HTTP shape: types and absolute
bounds; limits that depend on configuration or on the model are checked in `translate.py`),
and describe it in /openapi.json. Types are strict, so `"max_tokens": "10"` is a 400, not a guess.
The other top-level fields are kept aside (`model_extra`) for `fields.py`, which refuses the
unknown ones and forwards the engine's to vLLM's own request model on the worker; nested
objects the gateway reads (messages, stream_options) refuse unknown keys themselves.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from vllm_fleet.protocol.types import CHAT_ROLES


def _whole_number(value):
    # JSON (and JSON Schema's "integer") treats 5.0 as an integer; strict pydantic would not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _int(ge: int, le: int):
    """An integer field type in [ge, le]; the bounds sit on the type so the JSON schema shows them."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_whole_number)]


_Stop = Annotated[str, Field(min_length=1, max_length=1024)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Request(BaseModel):
    # Top level: fields.py judges what the schema does not model (see the module docstring).
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Body):
    include_usage: bool | None = Field(None, description="Send a last chunk with the usage of the whole request")
    continuous_usage_stats: bool | None = Field(
        None, description="With include_usage: usage so far on every chunk too (vLLM extension)")


class TextPart(_Body):
    type: str = Field(description="Only text parts are served")
    text: str = Field(description="The text")

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data):
        # Before field checks, so an image part is refused for what it is, not for its keys.
        if isinstance(data, dict) and data.get("type") != "text":
            raise ValueError(f"content part type {data.get('type')!r} is not supported: only text parts "
                             "(this fleet serves no multimodal inputs)")
        return data


class FunctionCallIn(_Body):
    name: str = Field(description="The function called")
    arguments: str = Field(description="Its arguments, as JSON text")


class ToolCallIn(_Body):
    id: str = Field(description="The call's id; a tool message answers it by tool_call_id")
    type: Literal["function"] = Field("function", description="Always function")
    function: FunctionCallIn


class ChatMessageIn(_Body):
    # One list of roles for the whole fleet (the worker's protocol); here it is HTTP shape, so a
    # wrong role is a 400 naming messages.N.role and /openapi.json shows the enum.
    role: Literal[CHAT_ROLES] = Field(description="Author of the message")
    content: str | list[TextPart] | None = Field(None, description="Text, or a list of text parts")
    name: str | None = Field(None, description="Author name, passed to the chat template")
    tool_calls: list[ToolCallIn] | None = Field(None, description="An assistant message's tool calls")
    tool_call_id: str | None = Field(None, description="A tool message: the call it answers")
    reasoning: str | None = Field(None, description="An assistant message's reasoning (vLLM extension)")
    reasoning_content: str | None = Field(None, description="Older name of reasoning")
    # What OpenAI's own answers carry: accepted empty, so a client can replay an answer as history.
    refusal: None = Field(None, description="Must be null")
    function_call: None = Field(None, description="Must be null: send tool_calls")
    audio: None = Field(None, description="Must be null")
    annotations: None = Field(None, description="Must be null")


class _Sampling(_Request):
    """Fields shared by both endpoints."""

    model: str = Field(min_length=1, max_length=512, description="Model to use; GET /v1/models lists them")
    stream: bool | None = Field(False, description="Stream the answer as server-sent events")
    stream_options: StreamOptions | None = Field(None, description="Streaming options")
    n: _int(1, 128) | None = Field(1, description="Samples per prompt (the gateway's --max-n applies)")
    stop: _Stop | Annotated[list[_Stop], Field(max_length=16)] | None = Field(
        None, description="Up to 16 strings that end generation"
    )
    seed: _int(-(2**63), 2**63 - 1) | None = Field(None, description="Seed for reproducible sampling")
    max_tokens: _int(1, 2**31 - 1) | None = Field(None, description="Most tokens to generate per sample")
    temperature: float | None = Field(None, ge=0, le=2, description="Sampling temperature")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling mass")
    top_k: _int(-1, 2**31 - 1) | None = Field(None, description="vLLM extension: sample among the k most likely tokens (-1: all)")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="Penalty on tokens already present")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="Penalty growing with a token's count")
    user: str | None = Field(None, max_length=512, description="End-user id; also the session key for cache affinity")
    session_id: str | None = Field(None, max_length=512, description="Session key for cache affinity (vLLM extension)")
    request_id: str | None = Field(None, min_length=1, max_length=128, description="Names the answer's id (vLLM extension)")
    priority: _int(-(2**31), 2**31 - 1) | None = Field(
        None, description="vLLM extension: scheduling priority, lower runs first (a worker that does not schedule "
                          "by priority refuses a non-zero one)")
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = Field(
        None, description="OpenAI's tier: 'flex' runs the request as batch (in capacity interactive traffic leaves "
                          "idle; slower to start, never failed for it); the others as interactive")


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions"""

    messages: list[ChatMessageIn] = Field(min_length=1, description="The conversation so far")
    max_completion_tokens: _int(1, 2**31 - 1) | None = Field(None, description="Alias of max_tokens (newer name)")
    logprobs: bool | None = Field(False, description="Return the log probability of each output token")
    top_logprobs: _int(0, 20) | None = Field(None, description="Alternatives per token with logprobs (needs logprobs)")
    echo: bool | None = Field(False, description="Start the answer with the last message when its role is the answer's")


_TokenIds = Annotated[list[_int(0, 2**31 - 1)], Field(min_length=1)]


class CompletionRequest(_Sampling):
    """POST /v1/completions"""

    prompt: str | Annotated[list[str], Field(min_length=1)] | _TokenIds | Annotated[list[_TokenIds], Field(min_length=1)] = Field(
        description="A string, a list of strings, a list of token ids, or a list of token-id lists"
    )
    logprobs: _int(0, 20) | None = Field(None, description="Alternatives per token to return with logprobs")
    echo: bool | None = Field(False, description="Start each choice with its prompt (with logprobs: its tokens too)")
    # 0 is vLLM's "echo only": the prompt and its logprobs, nothing generated (vLLM refuses it without echo).
    max_tokens: _int(0, 2**31 - 1) | None = Field(None, description="Most tokens to generate per sample (0: with "
                                                                     "echo, the prompt alone)")
