"""vLLM 0.32's decisions in rendering a chat request, taken again without vLLM (router side).

The worker renders with vLLM's HfRenderer (worker/openai/render.py); a router that wants the
same token ids must see the same conversation and template arguments. Each function below
names the vLLM 0.32 code whose decision it repeats:

- `content_format`: "string" or "openai" (renderers/hf.py `_detect_content_format`): "openai"
  when the template loops over a message's content (then text parts stay dicts), else each
  message's text parts are joined with newlines into one string.
- `conversation`: messages as the template sees them (renderers/chat_utils.py
  `_parse_chat_message_content`, `_postprocess_messages`), after vLLM's request model
  (pydantic) has validated them, which reorders a tool call's keys.
- `tool_dicts`: a request's tools as `ChatCompletionToolsParam.model_dump()` gives them.
- `template_kwargs`: the arguments `apply_chat_template` gets (ChatCompletionRequest.
  build_chat_params, ChatParams.with_defaults / get_apply_chat_template_kwargs, render.py's
  defaults, and hf.py `resolve_chat_template_kwargs`' filter).
- `developer_as_system`: the developer role for templates that do not know it.

What a router cannot render as the worker does raises Unrenderable; it then routes the request
without token ids. All functions are pure and thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any, Literal

ContentFormat = Literal["string", "openai"]

_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "thinking": "thinking",
               "refusal": "refusal"}
_SKIPPED_WHEN_EMPTY = ("text", "refusal")
# Fields of vLLM 0.32's content-part types; others ride along on a text part (openai format).
_KNOWN_PART_FIELDS = frozenset({
    "audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil", "image_url",
    "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text", "thinking", "type", "uuid",
    "video_embeds", "video_url"})
_BILLING_HEADER = "x-anthropic-billing-header"
_UNSET = (None, "auto")  # vLLM's merge_kwargs: an override with these values does not override


class Unrenderable(ValueError):
    """A request the router cannot render exactly as the worker will (media parts, a request
    the worker refuses): route it without token ids."""


# ----------------------------------------------------------------------------- content format

@lru_cache(maxsize=32)
def content_format(template: str) -> ContentFormat:
    """How the template takes message content: "openai" (a list of parts) or "string"."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        root = _compile_jinja_template(template).environment.parse(template)
    except Exception:  # vLLM's default when the template does not parse
        return "string"
    return "openai" if next(_content_loops(root), None) is not None else "string"


def _is_name(node: Any, name: str) -> bool:
    import jinja2.nodes as n

    return isinstance(node, n.Name) and node.ctx == "load" and node.name == name


def _is_item(node: Any, name: str, key: str) -> bool:
    import jinja2.nodes as n

    if isinstance(node, n.Getitem):
        return _is_name(node.node, name) and isinstance(node.arg, n.Const) and node.arg.value == key
    return isinstance(node, n.Getattr) and _is_name(node.node, name) and node.attr == key


def _reads(node: Any, name: str, key: str | None = None) -> bool:
    """`name` (or `name[key]`), possibly through filters, tests and slices."""
    import jinja2.nodes as n

    if isinstance(node, n.Filter):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, n.Test):
        return _reads(node.node, name, key)
    if isinstance(node, n.Getitem) and isinstance(node.arg, n.Slice):
        return _reads(node.node, name, key)
    return _is_item(node, name, key) if key else _is_name(node, name)


def _aliases(root: Any, name: str) -> list[str]:
    """`name` and every variable assigned from it, transitively."""
    import jinja2.nodes as n

    found, pending = [name], [name]
    while pending:
        current = pending.pop(0)
        for assign in root.find_all(n.Assign):
            if _reads(assign.node, current) and isinstance(assign.target, n.Name):
                found.append(assign.target.name)
                if assign.target.name != current:
                    pending.append(assign.target.name)
    return found


def _message_names(root: Any) -> list[str]:
    import jinja2.nodes as n

    names = []
    for loop in root.find_all(n.For):
        if any(_reads(loop.iter, alias) for alias in _aliases(root, "messages")):
            names.append(loop.target.name)
    return names


def _content_loops(root: Any) -> Iterator[Any]:
    """Loops over a message's content: `for part in message.content`, over a macro parameter
    that receives message.content, or over a variable named `content` outside macros."""
    import jinja2.nodes as n

    messages = _message_names(root)
    content_params: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(n.Macro):
        arg_names = [arg.name for arg in macro.args]
        params: set[str] = set()
        for call in root.find_all(n.Call):
            if not (isinstance(call.node, n.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(arg_names) and any(_reads(arg, m, "content") for m in messages):
                    params.add(arg_names[i])
            for kwarg in call.kwargs:
                if kwarg.key in arg_names and any(_reads(kwarg.value, m, "content") for m in messages):
                    params.add(kwarg.key)
        for loop in macro.find_all(n.For):
            in_macros.add(id(loop))
            if params:
                content_params[id(loop)] = params
    for loop in root.find_all(n.For):
        if any(_reads(loop.iter, m, "content") for m in messages):
            yield loop
        elif isinstance(loop.iter, n.Name) and loop.iter.name in content_params.get(id(loop), ()):
            yield loop
        elif id(loop) not in in_macros and isinstance(loop.iter, n.Name) and loop.iter.name == "content":
            yield loop


# ------------------------------------------------------------------------------ conversation

def conversation(messages: list[Mapping[str, Any]], fmt: ContentFormat) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to the chat template."""
    converted = [_message(message, fmt) for message in messages]
    for message in converted:
        _parse_tool_arguments(message)
    return converted


def _message(message: Mapping[str, Any], fmt: ContentFormat) -> dict[str, Any]:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise Unrenderable("a message without a role")
    role, content = message["role"], message.get("content")
    if type(content) is str and role != "system":
        # Plain text, most messages of a long chat: what _part makes of its one text part, without
        # building that part (~1 us a message; the system role may carry the billing header).
        texts: list[Any] = [content if fmt == "string" else {"type": "text", "text": content}]
    else:
        parts = [] if content is None else [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(parts, list):
            raise Unrenderable("message content is neither text nor a list of parts")
        if role == "system":
            parts = _without_billing_header(parts)
        texts = [text for text in (_part(part, fmt) for part in parts) if text is not None]
    result: dict[str, Any] = {"role": role, "content": texts if fmt == "openai" else "\n".join(texts)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            result["tool_calls"] = [_validated_call(call) for call in message["tool_calls"]]
        if message.get("reasoning") is not None:
            result["reasoning"] = result["reasoning_content"] = message["reasoning"]
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        if fmt == "openai" and all(item.get("type") == "text" for item in texts):
            result["content"] = "\n".join(item.get("text", "") for item in texts)
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    if isinstance(message.get("task"), str):
        result["task"] = message["task"]
    if role == "developer":
        result["tools"] = message.get("tools")
    return result


def _part(part: Any, fmt: ContentFormat) -> Any:
    """A text part's text (string format) or dict (openai format); None: skipped."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if fmt == "openai" else part
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind not in _TEXT_PARTS or part.get("uuid") is not None:
        raise Unrenderable(f"a {kind or 'untyped'} content part (media is rendered by the worker only)")
    text = part.get(_TEXT_PARTS[kind])
    if text is None and kind in _SKIPPED_WHEN_EMPTY:
        return None
    if not isinstance(text, str):
        raise Unrenderable(f"a {kind} part without text")
    if fmt == "string":
        return text
    return {"type": "text", "text": text, **{k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}}


def _without_billing_header(parts: list[Any]) -> list[Any]:
    """vLLM drops Claude Code's per-request attribution line from system text."""
    kept = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, Mapping) and \
            part.get("type") == "text" else None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            kept.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            kept.append(rest if isinstance(part, str) else {**part, "text": rest})
    return kept


def _validated_call(call: Any) -> Any:
    """A tool call with its keys in the order vLLM's request model leaves them (id, function
    (arguments, name), type, then any others)."""
    if not isinstance(call, Mapping):
        raise Unrenderable("assistant tool_calls entries must be objects")
    result = _ordered(call, ("id", "function", "type"))
    if isinstance(result.get("function"), Mapping):
        result["function"] = _ordered(result["function"], ("arguments", "name"))
    return result


def _ordered(mapping: Mapping[str, Any], first: tuple[str, ...]) -> dict[str, Any]:
    return {**{k: mapping[k] for k in first if k in mapping}, **{k: v for k, v in mapping.items() if k not in first}}


def _parse_tool_arguments(message: dict[str, Any]) -> None:
    """Tool-call arguments as dicts, the way templates expect them ({} when not a JSON object)."""
    calls = message.get("tool_calls")
    if message["role"] != "assistant" or not isinstance(calls, list):
        return
    if not calls:
        del message["tool_calls"]
        return
    for call in calls:
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise Unrenderable("only tool calls of type 'function'")
        arguments = function.get("arguments")
        if arguments and isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        function["arguments"] = arguments if isinstance(arguments, dict) else {}


def developer_as_system(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """For a template that never names "developer": developer messages become system ones, and
    all system messages merge into one at the front."""
    if not any(m["role"] == "developer" for m in messages) or '"developer"' in template or "'developer'" in template:
        return messages
    converted = [{k: v for k, v in m.items() if k != "tools"} | {"role": "system"} if m["role"] == "developer"
                 else m for m in messages]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    texts = []
    for i in systems:
        content = converted[i].get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] if isinstance(p, dict) and "text" in p else p for p in content
                                if isinstance(p, str) or (isinstance(p, dict) and "text" in p))
        if content:
            texts.append(content)
    return [{"role": "system", "content": "\n\n".join(texts)}] + [m for m in converted if m["role"] != "system"]


# ------------------------------------------------------------------------------- arguments

def tool_dicts(tools: list[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tools as vLLM's request model dumps them: unknown keys dropped, unset ones as None."""
    if tools is None:
        return None
    dumped = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise Unrenderable("a tool without a function name")
        fn: dict[str, Any] = {"name": function["name"], "description": function.get("description"),
                              "parameters": function.get("parameters")}
        if function.get("strict") is not None:
            fn["strict"] = function["strict"]
        deferred = tool.get("defer_loading")
        if function.get("defer_loading", deferred) is not None:
            fn["defer_loading"] = function.get("defer_loading", deferred)
        dumped.append({"type": "function", "function": fn} | ({"defer_loading": deferred} if deferred is not None
                                                               else {}))
    return dumped


def merge(defaults: Mapping[str, Any] | None, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """vLLM's merge_kwargs: overrides win unless None or "auto"."""
    return dict(defaults or {}) | {k: v for k, v in (overrides or {}).items() if v not in _UNSET}


def template_kwargs(template: str, accepted: frozenset[str], request_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The request's template arguments that reach the template: those it names, and the
    parameters of `apply_chat_template` (`accepted`), as vLLM filters them."""
    if "chat_template" in request_kwargs:
        raise Unrenderable("a request may not bring its own chat template")
    names = accepted | _template_variables(template)
    return {k: v for k, v in request_kwargs.items() if k in names and k not in ("chat_template", "tokenize")}


@lru_cache(maxsize=32)
def _template_variables(template: str) -> frozenset[str]:
    import jinja2.ext
    import jinja2.meta
    import jinja2.sandbox

    class Generation(jinja2.ext.Extension):  # HF's {% generation %} tag, parsed only
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_noop"), [], [], body).set_lineno(lineno)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[Generation, jinja2.ext.loopcontrols])
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))
