"""Anthropic's Messages API (POST /v1/messages) in front of the fleet.

The split: the gateway checks what it reads and routes on, and frames the answer (request.py,
answer.py, events.py, errors.py); the body travels to the worker as endpoint "messages", where
vLLM's own AnthropicMessagesRequest and conversion turn it into a chat request
(worker/openai/messages.py). Routing, failover, migration and limits are the chat path's.
"""

from vllm_fleet.gateway.anthropic.errors import anthropic_response
from vllm_fleet.gateway.anthropic.handler import AnthropicHandler

# Routes whose errors are Anthropic's shape (app.py).
PATHS = frozenset(("/v1/messages", "/v1/messages/count_tokens"))

__all__ = ["PATHS", "AnthropicHandler", "anthropic_response"]
