"""A prompt's token ids at the router, before it picks a worker (for the KV-cache index).

`PromptTokenizer` renders and tokenizes a request as the worker's vLLM 0.32 would, from the
tokenizer files a worker sends (TokenizerFiles; local files only, never the Hub):

- chat: the conversation and template arguments vLLM builds (prompt/chat_render.py), the model's own
  template (`tokenizer.get_chat_template`, the tool-use one when tools are given), rendered to
  text, then tokenized with `add_special_tokens` False unless the request sets it (vLLM's chat
  default: the template writes its own BOS);
- completion: text tokenized with `add_special_tokens` True unless the request sets it (vLLM's
  completion default); token ids as they are.

The worker stays the authority: these ids only steer routing, and a request the router cannot
render as the worker will (media, `truncate_prompt_tokens`) gets None.

`TokenizerCache` fetches each served model's files once from one of its workers into a cache
folder, in the background: until they are loaded, `ids_for` answers None at once and the router
routes without cache knowledge. Routing never waits on a fetch.

Tokenizing a rendered prompt goes piece by piece between its special tokens, through a
bounded cache of each piece's ids (router/prompt/segments.py: exact, checked per tokenizer at
load): a shared system prompt or document, or a conversation's earlier turns, is tokenized once
(a fresh 2,000-token text costs the tokenizer ~1.2 ms on this project's 2-core VM; from the cache
~0.1 ms). A tokenizer whose pieces would tokenize otherwise tokenizes whole texts, as before.

Thread-safety: both classes may be called from any thread (rendering a long chat takes
milliseconds, so a router moves it to a thread pool). HF fast tokenizers change their
truncation settings while encoding, so one thread at a time uses the tokenizer (a lock around
rendering and encoding). Both hold the GIL throughout, so the lock costs no parallelism; the
per-thread copies it replaced did cost: each was a deepcopy holding the GIL 110-425 ms, made on
a thread's first use mid-traffic, and every request on the event loop waited for it (cache_aware's
routing decision P99 90-260 ms on mock engines).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from vllm_fleet.errors import FleetError
from vllm_fleet.protocol.tokenizer_files import folder_digest
from vllm_fleet.router.prompt import chat_render
from vllm_fleet.router.prompt.chat_render import Unrenderable
from vllm_fleet.router.prompt.segments import MAX_CHARS, PartialIds, SegmentTokenizer

logger = logging.getLogger(__name__)

# The vLLM release whose chat rendering prompt/chat_render.py repeats (major.minor). Other releases
# decide differently in places (the developer role, malformed tool-call arguments, content-part
# fields), so chat requests to a worker running another one get no router-side ids; completions
# do (text through the tokenizer with vLLM's add_special_tokens default, or ids as given: the
# same in every release we support).
MIRRORED_VLLM = "0.32"
# The body fields that change the rendered prompt; the others only change sampling.
_CHAT_FIELDS = ("tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                "add_special_tokens", "documents", "reasoning_effort")


class PromptTokenizer:
    """One model's prompt rendering and tokenization, as its workers do it."""

    def __init__(self, tokenizer: Any, *, piece_cache_chars: int = MAX_CHARS, digest: str = "") -> None:
        """`piece_cache_chars`: the bound of the piece cache in characters (0: no cache). `digest`:
        of the files it was loaded from (protocol/tokenizer_files.py), "" = unknown."""
        self._tokenizer = tokenizer
        self.digest = digest   # a worker whose WorkerInfo.tokenizer_digest equals it may take these ids
        self._lock = threading.Lock()   # one thread at a time renders and encodes (module docstring)
        self._backend = _LockedBackend(getattr(tokenizer, "backend_tokenizer", None), self._lock)
        self._accepted = _apply_chat_template_params(tokenizer)
        self.pieces = SegmentTokenizer.build(tokenizer, max_chars=piece_cache_chars) if piece_cache_chars else None

    @classmethod
    def load(cls, folder: str | Path, *, piece_cache_chars: int = MAX_CHARS) -> PromptTokenizer:
        """The tokenizer in `folder` (files from TokenizerFiles). Blocking: ~0.2-1 s."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        return cls(tokenizer, piece_cache_chars=piece_cache_chars, digest=folder_digest(folder))

    def chat_ids(self, messages: list[dict], *, tools: list[dict] | None = None,
                 chat_template_kwargs: dict | None = None, add_generation_prompt: bool = True,
                 continue_final_message: bool = False, add_special_tokens: bool = False,
                 documents: list[dict] | None = None, reasoning_effort: str | None = None,
                 head_chars: int = 0) -> list[int] | PartialIds:
        """The token ids of a chat request's prompt. Raises Unrenderable for what only the worker
        renders (media parts) or refuses. `head_chars` > 0: a PartialIds may answer
        (SegmentTokenizer.encode)."""
        if add_generation_prompt and continue_final_message:
            raise Unrenderable("add_generation_prompt and continue_final_message together (vLLM refuses it)")
        tool_dicts = chat_render.tool_dicts(tools)
        # ChatCompletionRequest.build_chat_params, then render.py's defaults (tools, tokenize=False)
        user_kwargs = dict(chat_template_kwargs or {})
        extra: dict[str, Any] = {"add_generation_prompt": add_generation_prompt,
                                 "continue_final_message": continue_final_message,
                                 "documents": documents, "reasoning_effort": reasoning_effort}
        if reasoning_effort is not None and "enable_thinking" not in user_kwargs:
            extra["enable_thinking"] = reasoning_effort != "none"
        kwargs = chat_render.merge({"tools": tool_dicts, "tokenize": False}, chat_render.merge(user_kwargs, extra))
        kwargs = chat_render.merge(kwargs, {"return_dict": False})
        tool_dicts = kwargs.pop("tools", None)
        kwargs.pop("tokenize", None)
        tokenizer = self._tokenizer
        with self._lock:
            try:
                template = tokenizer.get_chat_template(None, tools=tool_dicts)
            except ValueError as exc:
                raise Unrenderable(f"the model has no chat template: {exc}") from None
            fmt = chat_render.content_format(template)
            conversation = chat_render.developer_as_system(chat_render.conversation(messages, fmt), template)
            template_kwargs = chat_render.template_kwargs(template, self._accepted, kwargs)
            try:
                text = tokenizer.apply_chat_template(conversation=conversation, tools=tool_dicts,
                                                     chat_template=template, tokenize=False, **template_kwargs)
            except Exception as exc:  # the template refused the request; the worker will too
                raise Unrenderable(f"the chat template refused the request: {exc}") from None
        return self._encode(text, add_special_tokens, head_chars)

    def completion_ids(self, prompt: str | list[int], *, add_special_tokens: bool = True,
                       head_chars: int = 0) -> list[int] | PartialIds:
        """The token ids of a completion prompt: text tokenized, ids as they are."""
        if not prompt:
            raise Unrenderable("an empty prompt (vLLM refuses it)")
        if isinstance(prompt, str):
            return self._encode(prompt, add_special_tokens, head_chars)
        return list(prompt)

    def request_ids(self, body: Mapping[str, Any], *, messages: list[dict] | None = None,
                    prompt: str | list[int] | None = None, head_chars: int = 0) -> list[int] | PartialIds:
        """The ids of one input of a request whose OpenAI body is `body` (fields the prompt
        does not depend on are ignored); `head_chars`: as chat_ids."""
        if body.get("truncate_prompt_tokens") is not None:
            raise Unrenderable("truncate_prompt_tokens (left to the worker)")
        if messages is not None:
            fields = {k: body[k] for k in _CHAT_FIELDS if body.get(k) is not None}
            return self.chat_ids(messages, **fields, head_chars=head_chars)
        if prompt is None:
            raise Unrenderable("neither messages nor a prompt")
        return self.completion_ids(prompt, add_special_tokens=body.get("add_special_tokens", True),
                                   head_chars=head_chars)

    def warm_next_turn(self, body: Mapping[str, Any], messages: list[dict], answer: str) -> None:
        """Put the pieces of `messages` + the assistant's `answer` + a user's next message into
        the piece cache, rendered as the next turn's prompt will render them (the answer no longer
        last, so a template that treats the last assistant message apart renders it as history).
        Nothing to do without a piece cache; a conversation the router cannot render is left alone."""
        if self.pieces is None:
            return
        fields = {k: body[k] for k in _CHAT_FIELDS if body.get(k) is not None and k != "continue_final_message"}
        fields["add_generation_prompt"] = True
        turn = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "."}]
        try:
            self.chat_ids(turn, **fields)
        except Unrenderable as exc:
            logger.debug("the next turn's pieces not cached: %s", exc)

    def _encode(self, text: str, add_special_tokens: bool, head_chars: int = 0) -> list[int] | PartialIds:
        """`text`'s ids: from the piece cache where it applies, else the tokenizer on the whole text."""
        if self.pieces is not None:
            # The piece cache's hits need no tokenizer; its misses encode through the locked backend
            # (a PartialIds finishing later, on any thread, too).
            ids = self.pieces.encode(self._backend, text, add_special_tokens=add_special_tokens, head_chars=head_chars)
            if ids is not None:
                return ids
        with self._lock:
            return list(self._tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


# Texts at least this long are encoded with the GIL released (`_LockedBackend`): ~0.5 ms of
# tokenizing and up (SmolLM2's tokenizer here: ~0.3-0.6 us a character), where the event loop would
# otherwise stand still for the whole call (a 40,000-character document: tens of milliseconds).
# Shorter texts (a decision's 250-character head, a question) keep `encode`: there the GIL's
# hand-offs cost the request more than the loop gains (below).
RELEASE_GIL_CHARS = 2_000


class _LockedBackend:
    """A `tokenizers.Tokenizer`'s `encode`, one caller at a time (PromptTokenizer's lock).

    `Tokenizer.encode` holds the GIL for its whole call, so a prompt tokenized on a thread stalls
    the router's event loop just the same (a loop kept 3% of its pace beside a thread encoding);
    `encode_batch([text])` releases it while Rust tokenizes (96%). For every text that cost: a
    cache-aware gateway's TTFT P50 was 1.06-1.16x and its CPU a token 1.07-1.12x with 200-word
    prompts on 2 busy cores (three rounds of three, benchmarks/RESULTS.md, #49 goal 2): each hand-off
    of the GIL waits on the loop. So only long texts are encoded with it released."""

    __slots__ = ("_backend", "_lock")

    def __init__(self, backend: Any, lock: threading.Lock) -> None:
        self._backend = backend
        self._lock = lock

    def encode(self, text: str, **kwargs: Any) -> Any:
        with self._lock:
            if len(text) >= RELEASE_GIL_CHARS:
                return self._backend.encode_batch([text], **kwargs)[0]
            return self._backend.encode(text, **kwargs)


def _apply_chat_template_params(tokenizer: Any) -> frozenset[str]:
    """The named parameters of apply_chat_template (vLLM passes these through its filter)."""
    names = set(inspect.signature(type(tokenizer).apply_chat_template).parameters)
    try:
        from transformers import PythonBackend

        names |= set(inspect.signature(PythonBackend.apply_chat_template).parameters)
    except ImportError:  # transformers 4: PythonBackend was PreTrainedTokenizer; same parameters
        pass
    return frozenset(names - {"kwargs", "args"})


class TokenizerSource(Protocol):
    """What the cache fetches files from: a WorkerClient of a worker serving the model."""

    async def tokenizer_files(self, dest_dir: str | Path, *, timeout: float = ...) -> list[str]: ...


class TokenizerCache:
    """Per served model, its PromptTokenizer once fetched; never waited on by routing.

    `ensure(model, source)` starts a fetch (files into `cache_dir`, then the load in a thread)
    unless the model has its tokenizer or a fetch under way; after a failure, the next try
    waits `retry_after_s`. `ids_for` answers None until the tokenizer is ready. Create and call
    `ensure` inside the router's event loop; `get` and `ids_for` from any thread.
    """

    def __init__(self, cache_dir: str | Path, *, retry_after_s: float = 30.0, fetch_timeout_s: float = 120.0,
                 piece_cache_chars: int = MAX_CHARS) -> None:
        self.cache_dir = Path(cache_dir)
        self.piece_cache_chars = piece_cache_chars   # each model's piece cache bound (PromptTokenizer)
        self.retry_after_s = retry_after_s
        self.fetch_timeout_s = fetch_timeout_s
        self._ready: dict[str, PromptTokenizer] = {}
        self._fetching: dict[str, asyncio.Task[PromptTokenizer | None]] = {}
        self._failed_at: dict[str, float] = {}
        self._completions_only: set[str] = set()   # models whose workers run another vLLM release

    def get(self, model: str) -> PromptTokenizer | None:
        return self._ready.get(model)

    def settled(self, model: str) -> bool:
        """Whether waiting for `model`'s tokenizer is over: loaded, or its last fetch failed
        (the next try comes after `retry_after_s`; a wait should not last that long)."""
        return model in self._ready or (model in self._failed_at and model not in self._fetching)

    def states(self) -> dict[str, str]:
        """Each model asked for: "ready", "loading" or "failed" (the dashboard's cache index view)."""
        models = {*self._ready, *self._fetching, *self._failed_at}
        return {m: "ready" if m in self._ready else "loading" if m in self._fetching else "failed" for m in sorted(models)}

    def ensure(self, model: str, source: TokenizerSource, *,
               engine_version: str | None = None) -> asyncio.Task[PromptTokenizer | None] | None:
        """Start fetching `model`'s tokenizer from `source` if needed; the fetch task, or None
        when there is nothing to do (ready, or failed less than retry_after_s ago). A worker
        whose `engine_version` (WorkerInfo) is a vLLM whose chat rendering this module does not
        repeat makes the model's chat requests route without ids (completions keep theirs)."""
        if engine_version is not None and not _mirrored(engine_version) and model not in self._completions_only:
            self._completions_only.add(model)
            logger.warning("%s: workers run vLLM %s, the router renders chat as vLLM %s does; chat requests "
                           "route without token ids, completions with them", model, engine_version, MIRRORED_VLLM)
        if model in self._ready:
            return None
        task = self._fetching.get(model)
        if task is not None:
            return task
        failed_at = self._failed_at.get(model)
        if failed_at is not None and time.monotonic() - failed_at < self.retry_after_s:
            return None
        task = self._fetching[model] = asyncio.get_running_loop().create_task(self._fetch(model, source))
        return task

    async def _fetch(self, model: str, source: TokenizerSource) -> PromptTokenizer | None:
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(dir=self.cache_dir, prefix=_safe_name(model) + "-"))
            names = await source.tokenizer_files(folder, timeout=self.fetch_timeout_s)
            tokenizer = await asyncio.to_thread(PromptTokenizer.load, folder, piece_cache_chars=self.piece_cache_chars)
        except (FleetError, OSError, ValueError) as exc:  # the model routes without ids meanwhile
            self._failed_at[model] = time.monotonic()
            logger.warning("no tokenizer for %s at the router (next try in %.0f s): %s", model, self.retry_after_s, exc)
            return None
        finally:
            self._fetching.pop(model, None)
        self._ready[model] = tokenizer
        self._failed_at.pop(model, None)
        logger.info("tokenizer for %s ready at the router (%s)", model, ", ".join(names))
        return tokenizer

    def ids_for(self, model: str, body: Mapping[str, Any], *, messages: list[dict] | None = None,
                prompt: str | list[int] | None = None, head_chars: int = 0) -> list[int] | PartialIds | None:
        """The prompt's token ids as the model's workers will run them, or None: tokenizer not
        ready, or a request the router cannot render exactly (it routes without ids).
        `head_chars` > 0: a PartialIds may answer (SegmentTokenizer.encode)."""
        tokenizer = self._ready.get(model)
        if tokenizer is None or (messages is not None and model in self._completions_only):
            return None
        try:
            return tokenizer.request_ids(body, messages=messages, prompt=prompt, head_chars=head_chars)
        except Unrenderable as exc:
            logger.debug("%s: prompt not tokenized at the router: %s", model, exc)
            return None


    def digest(self, model: str) -> str:
        """The digest of the files `model`'s tokenizer here was loaded from; "" until it is ready."""
        tokenizer = self._ready.get(model)
        return tokenizer.digest if tokenizer is not None else ""

    def warm_next_turn(self, model: str, body: Mapping[str, Any], messages: list[dict], answer: str) -> None:
        """PromptTokenizer.warm_next_turn with `model`'s tokenizer, when it is ready and renders chat."""
        tokenizer = self._ready.get(model)
        if tokenizer is not None and model not in self._completions_only:
            tokenizer.warm_next_turn(body, messages, answer)


def _mirrored(engine_version: str) -> bool:
    return engine_version == MIRRORED_VLLM or engine_version.startswith(MIRRORED_VLLM + ".")


def _safe_name(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:80] or "model"
