"""Request bodies of the OpenAI endpoints, as pydantic models.

They do two jobs: validate what clients send (HTTP shape: types and absolute bounds; limits
that depend on configuration or on the model are checked in `translate.py`, the engine's own
in the worker), and describe it in /openapi.json.
Unknown fields are ignored, as OpenAI clients add new ones often; types are strict, so
`"max_tokens": "10"` is a 400, not a guess.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

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
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool | None = Field(None, description="Send a last chunk with the usage of the whole request")


class TextPart(_Body):
    type: Literal["text"] = Field(description="Only text parts are supported")
    text: str = Field(description="The text")


class ChatMessageIn(_Body):
    # One list of roles for the whole fleet (the worker's protocol); here it is HTTP shape, so a
    # wrong role is a 400 naming messages.N.role and /openapi.json shows the enum.
    role: Literal[CHAT_ROLES] = Field(description="Author of the message")
    content: str | list[TextPart] | None = Field(description="Text, or a list of text parts")
    name: str | None = Field(None, description="Optional author name (accepted, not used)")


class _Sampling(_Body):
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


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions"""

    messages: list[ChatMessageIn] = Field(min_length=1, description="The conversation so far")
    max_completion_tokens: _int(1, 2**31 - 1) | None = Field(None, description="Alias of max_tokens (newer name)")
    logprobs: bool | None = Field(False, description="Return the log probability of each output token")
    top_logprobs: _int(0, 20) | None = Field(None, description="Alternatives per token with logprobs (needs logprobs)")


_TokenIds = Annotated[list[_int(0, 2**31 - 1)], Field(min_length=1)]


class CompletionRequest(_Sampling):
    """POST /v1/completions"""

    prompt: str | Annotated[list[str], Field(min_length=1)] | _TokenIds | Annotated[list[_TokenIds], Field(min_length=1)] = Field(
        description="A string, a list of strings, a list of token ids, or a list of token-id lists"
    )
    logprobs: _int(0, 20) | None = Field(None, description="Alternatives per token to return with logprobs")
    echo: bool | None = Field(False, description="Not supported: must be false")
    suffix: str | None = Field(None, description="Not supported: must be empty")
