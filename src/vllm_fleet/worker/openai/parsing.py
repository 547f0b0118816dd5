"""Tool-call and reasoning parsing of an OpenAI chat stream, with vLLM's own parsers.

vLLM's server (entrypoints/openai/chat_completion/serving.py) holds one `vllm.parser.Parser`
per choice, adjusts the request with it before building sampling params (a named or
"required" tool_choice becomes a grammar constraint there), and turns each engine delta into
a `DeltaMessage` (content, reasoning, tool-call pieces) with `Parser.parse_delta`. This module
does the same on the worker, per (input, sample) stream, and hands typed deltas to
`RequestStream`; the gateway only formats them.

Where we follow vLLM and where not:
- `parser_class` is `vllm.parser.ParserManager.get_parser`: like `vllm serve`, a tool parser
  is used only with `--enable-auto-tool-choice`.
- A named/"required" tool_choice with no tool parser: vLLM 0.32's server refuses it
  ('requires --tool-call-parser to be set'); we keep what earlier vLLM servers did (the lead's
  decision for models without a parser, e.g. SmolLM2): the JSON schema of the tool(s) from
  vLLM's `get_json_schema_from_tools` constrains the output, and vLLM's own streaming helpers
  (`extract_named_tool_call_streaming` / `extract_required_tool_call_streaming`) make the
  tool-call deltas.
- Resume after migration: `StreamParser.prime` runs the tokens the client already has through
  a fresh parser and discards the output, so parsing continues where the dead worker stopped.

vLLM versions: `vllm.parser` exists in both vLLM 0.32 (here) and 0.26 (the GPU box; checked in
its wheel). Where their signatures differ (0.26: `get_parser` takes no tokenizer,
`get_json_schema_from_tools` no parallel_tool_calls, `extract_required_tool_call_streaming`
also takes delta_text / function_name_returned), calls pass only the arguments the installed
function accepts (`_call`). A vLLM without `vllm.parser` gets a ConfigError naming its version
at start when a tool or reasoning parser is configured; with neither it serves as before.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from vllm_fleet.errors import ConfigError, InvalidRequestError
from vllm_fleet.protocol.types import ToolCallDelta

logger = logging.getLogger(__name__)

_AUTO_NEEDS_PARSER = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def _parser_manager():
    try:
        from vllm.parser import ParserManager
    except ImportError as error:
        import vllm

        raise ConfigError(
            f"--tool-call-parser / --reasoning-parser need vllm.parser (vLLM >= 0.32); this worker "
            f"has vLLM {vllm.__version__}: start it without those options or upgrade vLLM"
        ) from error
    return ParserManager


def parser_class(tool_call_parser: str | None, reasoning_parser: str | None, *,
                 enable_auto_tool_choice: bool = False, tokenizer: Any = None) -> type | None:
    """vLLM's composed Parser class for the worker's options; None when no parser applies.

    As in `vllm serve`, the tool parser is used only with enable_auto_tool_choice. With a
    tokenizer the class is checked against it (a parser needing tokens the vocabulary lacks
    fails here, at start). Raises ConfigError for an unknown name, listing the known ones.
    """
    if not tool_call_parser and not reasoning_parser:
        return None
    manager = _parser_manager()
    _check_names(tool_call_parser, reasoning_parser)
    try:
        parser_cls = _call(manager.get_parser, tool_parser_name=tool_call_parser,
                           reasoning_parser_name=reasoning_parser, enable_auto_tools=enable_auto_tool_choice)
    except (TypeError, ValueError, KeyError) as error:
        raise ConfigError(f"parser options cannot be used: {error}") from error
    if parser_cls is not None and tokenizer is not None:
        try:
            parser_cls(tokenizer)  # what vLLM 0.32 checks at start: the parsers find their tokens
        except Exception as error:  # noqa: BLE001 - any failure here means the pair does not fit
            raise ConfigError(f"--tool-call-parser {tool_call_parser} / --reasoning-parser {reasoning_parser} "
                              f"cannot be used with this model's tokenizer: {error}") from error
    return parser_cls


def _call(function: Callable, **kwargs: Any) -> Any:
    """`function` with those of `kwargs` it accepts (vLLM 0.26 and 0.32 differ in a few)."""
    accepted = inspect.signature(function).parameters
    return function(**{name: value for name, value in kwargs.items() if name in accepted})


def _check_names(tool_call_parser: str | None, reasoning_parser: str | None) -> None:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    for option, name, manager in (("--tool-call-parser", tool_call_parser, ToolParserManager),
                                  ("--reasoning-parser", reasoning_parser, ReasoningParserManager)):
        if not name:
            continue
        known = sorted(set(_registered(manager)))
        if known and name not in known:
            raise ConfigError(f"{option} {name!r} is not a vLLM parser; known: {', '.join(known)}")


def _registered(manager) -> list[str]:
    names = []
    for attribute in ("tool_parsers", "reasoning_parsers", "lazy_parsers"):
        names.extend(getattr(manager, attribute, {}) or {})
    return names


def chat_template_kwargs(vllm_request) -> dict[str, Any]:
    """The chat-template kwargs vLLM's server gives the parser (enable_thinking and the like)."""
    return dict(vllm_request.build_chat_params(None, "auto").chat_template_kwargs or {})


def is_chat_request(vllm_request) -> bool:
    """Whether a vLLM request is a chat completion (only those have tool/reasoning parsing)."""
    return hasattr(vllm_request, "messages") and hasattr(vllm_request, "tool_choice")


def tool_choice_kind(vllm_request) -> str | None:
    """'named', 'required', 'auto' or None (no tools, or tool_choice none)."""
    choice = getattr(vllm_request, "tool_choice", None)
    if not getattr(vllm_request, "tools", None) or choice in (None, "none"):
        return None
    if choice in ("auto", "required"):
        return choice
    return "named"


def adjust_request(parser_cls: type | None, tokenizer: Any, vllm_request, enable_auto_tool_choice: bool):
    """What vLLM's server does to a chat request before `to_sampling_params`.

    Raises InvalidRequestError (param tool_choice) for tool_choice "auto" with no tool parser
    and no --enable-auto-tool-choice, in vLLM's words.
    """
    kind = tool_choice_kind(vllm_request)
    has_tool_parser = parser_cls is not None and parser_cls.tool_parser_cls is not None
    if kind == "auto" and not has_tool_parser and not enable_auto_tool_choice:
        raise InvalidRequestError(_AUTO_NEEDS_PARSER, param="tool_choice")
    if not has_tool_parser and kind in ("named", "required"):
        _constrain_to_tools(vllm_request)
    if parser_cls is None:
        return vllm_request
    # vLLM adjusts when a reasoning parser is set, or tools may be called (online_renderer).
    if getattr(parser_cls, "always_adjust_request", False) or parser_cls.reasoning_parser_cls is not None or \
            getattr(vllm_request, "tool_choice", "none") != "none":
        parser = parser_cls(tokenizer, vllm_request.tools, chat_template_kwargs=chat_template_kwargs(vllm_request))
        vllm_request = parser.adjust_request(vllm_request)
    return vllm_request


def _constrain_to_tools(vllm_request) -> None:
    """Named/required tool_choice with no tool parser: the tools' JSON schema constrains the output."""
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    try:
        schema = _call(get_json_schema_from_tools, tool_choice=vllm_request.tool_choice, tools=vllm_request.tools,
                       parallel_tool_calls=vllm_request.parallel_tool_calls)
    except ValueError as error:
        raise InvalidRequestError(str(error), param="tool_choice") from error
    if schema is not None:
        vllm_request.structured_outputs = StructuredOutputsParams(json=schema)
        vllm_request.response_format = None


def resolve_reasoning_ended(parser_cls: type | None, tokenizer: Any, vllm_request,
                            prompt_token_ids: list[int]) -> bool | None:
    """The engine's `reasoning_ended` for structured outputs, as vLLM 0.32's server passes it
    (None on a vLLM without it: the engine then decides from the prompt itself)."""
    if not hasattr(vllm_request, "resolve_reasoning_ended"):
        return None
    parser = None
    if parser_cls is not None:
        parser = parser_cls(tokenizer, vllm_request.tools, chat_template_kwargs=chat_template_kwargs(vllm_request))
    return vllm_request.resolve_reasoning_ended(parser, prompt_token_ids)


class StreamParser:
    """Typed deltas of one (input, sample) stream: feed engine deltas in, in order."""

    def __init__(self, parser, vllm_request, prompt_token_ids: list[int], kind: str | None,
                 tokenizer: Any) -> None:
        self._parser = parser                    # vLLM Parser, or None for the no-tool-parser path
        self._request = vllm_request
        self._prompt_token_ids = list(prompt_token_ids)
        self._kind = kind
        self._tokenizer = tokenizer
        # A forced tool_choice with no tool parser: the (reasoning-free) output is the call's JSON,
        # which vLLM's streaming helpers turn into tool-call pieces.
        self._calls_from_content = kind in ("named", "required") and getattr(parser, "tool_parser", None) is None
        self._text = ""                          # "required" with no tool parser: the whole output so far
        self._name_sent = False
        self._call_index = 0
        self.tools_streamed = False

    @classmethod
    def create(cls, parser_cls: type | None, tokenizer: Any, vllm_request,
               prompt_token_ids: Sequence[int]) -> StreamParser | None:
        """A parser for one stream, or None when the stream is plain content."""
        kind = tool_choice_kind(vllm_request)
        if parser_cls is not None:
            parser = parser_cls(tokenizer, vllm_request.tools, chat_template_kwargs=chat_template_kwargs(vllm_request))
            return cls(parser, vllm_request, list(prompt_token_ids), kind, tokenizer)
        if kind in ("named", "required"):
            return cls(None, vllm_request, list(prompt_token_ids), kind, tokenizer)
        return None

    def prime(self, resume_token_ids: list[int], resume_text: str | None = None) -> None:
        """Run the tokens the client already has through the parser; the output is theirs already.

        Their text is decoded here unless given, the way the engine detokenizes the request.
        """
        if not resume_token_ids:
            return
        if resume_text is None:
            resume_text = self._tokenizer.decode(
                list(resume_token_ids), skip_special_tokens=getattr(self._request, "skip_special_tokens", True))
        self.feed(resume_text, list(resume_token_ids), finished=False)

    def feed(self, delta_text: str, delta_token_ids: list[int],
             finished: bool) -> tuple[str, str, list[ToolCallDelta]]:
        """(content, reasoning, tool-call pieces) for one engine delta."""
        content, reasoning, calls = delta_text, "", []
        if self._parser is not None:
            message = self._parser.parse_delta(delta_text, list(delta_token_ids), self._request,
                                               self._prompt_token_ids, finished=finished)
            content = (message.content or "") if message else ""
            reasoning = (message.reasoning or "") if message else ""
            calls = (message.tool_calls or []) if message else []
        if self._calls_from_content and content:
            message = self._tool_calls_from(content)
            content, calls = "", (message.tool_calls or []) if message else []
        pieces = [_tool_call_delta(call) for call in calls]
        if pieces:
            self.tools_streamed = True
        return content, reasoning, pieces

    def finish_reason(self, engine_reason: str) -> str:
        """vLLM's streamed finish_reason: "tool_calls" once a tool call was streamed and the
        model stopped, except for a named tool_choice (OpenAI says "stop" there)."""
        if self.tools_streamed and self._kind != "named" and engine_reason == "stop":
            return "tool_calls"
        return engine_reason

    def _tool_calls_from(self, delta_text: str):
        from vllm.tool_parsers.streaming import (
            extract_named_tool_call_streaming,
            extract_required_tool_call_streaming,
        )

        if self._kind == "named":
            message, self._name_sent = extract_named_tool_call_streaming(
                delta_text=delta_text, function_name=self._request.tool_choice.function.name,
                function_name_returned=self._name_sent, tool_call_idx=self._call_index,
                tool_call_id_type="random", tokenizer=self._tokenizer)
            return message
        previous, self._text = self._text, self._text + delta_text
        message, self._name_sent = _call(
            extract_required_tool_call_streaming, previous_text=previous, current_text=self._text,
            delta_text=delta_text, function_name_returned=self._name_sent, tool_call_idx=self._call_index,
            tool_call_id_type="random")
        if message is not None and message.tool_calls:
            self._call_index += sum(call.id is not None for call in message.tool_calls)
        return message


def _tool_call_delta(call) -> ToolCallDelta:
    function = call.function
    return ToolCallDelta(index=call.index, id=call.id or "", name=(function.name if function else None) or "",
                         arguments=(function.arguments if function else None) or "")
