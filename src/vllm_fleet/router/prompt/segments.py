"""Exact tokenization of rendered prompts at the router, piece by piece, from a bounded cache.

HF fast tokenizers (`tokenizers`) first extract the added tokens matched on the raw text
(`normalized=False`: every special token a chat template writes, such as `<|im_start|>`), then
normalize, pre-tokenize and tokenize each piece of text between them on its own. So a text's
ids are its pieces' ids with each extracted token's id between them, and a piece's ids do not
depend on what surrounds it. A chat prompt's pieces are its messages (and the template's fixed
strings): a tenant's long system prompt, a shared document and the earlier turns of a
conversation come back as the same pieces, and their ids come from the cache for a dict lookup.
Only new text goes through the tokenizer.

Text that no such token separates is never split: the pre-tokenizer's rules (GPT-2's regex,
whitespace runs) make a cut anywhere else change the ids.

Not every tokenizer splits exactly. `SegmentTokenizer.build` refuses one (answers None: the
caller tokenizes whole texts, as before) when
- an added token matched on the raw text strips spaces around it or matches single words
  (its match then depends on the neighbouring text),
- a pre-tokenizer or normalizer treats the text's first piece apart (Metaspace with
  `prepend_scheme: first`, Llama/Mistral style: only the piece at offset 0 gets the "▁"),
- special tokens are not extracted at all (`split_special_tokens`, `encode_special_tokens`),
- or its pieces' ids differ from the whole text's on probe texts (special tokens at the
  start and end, back to back, between spaces and newlines, in non-ASCII text), through the
  same `tokenizer(text, add_special_tokens=...)` call PromptTokenizer made before.
With `add_special_tokens`, the post-processor's ids around the text (a BOS) are learnt from the
probes; a post-processor that does anything else leaves those requests to whole texts.

Memory bound: at most `max_chars` characters of cached pieces (default 8,000,000) and
`max_entries` pieces (default 50,000), least recently used evicted first; a piece over a quarter
of `max_chars` is not cached, so one huge prompt cannot flush the rest. Each cached piece keeps
its text (1-4 bytes a character) and its ids (4 bytes each, ~1 per 4 characters of English) and
~200 bytes of bookkeeping: ~20 MB for 8 million ASCII characters, 74 MB at worst. Per model.

Thread-safety: the cache is shared by the threads rendering prompts (one lock, held for dict
operations only); encoding goes through the backend the caller passes (PromptTokenizer passes
one that lets one thread encode at a time).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from array import array
from collections import OrderedDict
from typing import Any, Callable

from vllm_fleet.router.prompt import head_cut

logger = logging.getLogger(__name__)

MAX_CHARS = 8_000_000
MAX_ENTRIES = 50_000
_EMPTY = array("I")   # an empty piece's ids (between two adjacent tokens), never cached


class PartialIds:
    """A prompt's leading ids, exactly the whole text's first `len(head)`, and the way to the rest.

    `rest_chars` characters are not tokenized yet; `chars_per_token` is what the tokenized part
    of the cut piece measured, for an estimate of the rest's tokens (`estimated_tokens`), which
    is only good for weighing costs, never for a limit. `complete()` tokenizes the rest (once;
    the cut piece then enters the piece cache) and answers the whole text's ids; call it on any
    thread (it encodes through the backend that made it)."""

    __slots__ = ("head", "rest_chars", "chars_per_token", "_finish", "_ids")

    def __init__(self, head: list[int], rest_chars: int, chars_per_token: float,
                 finish: Callable[[], list[int]]) -> None:
        self.head = head
        self.rest_chars = rest_chars
        self.chars_per_token = chars_per_token
        self._finish = finish
        self._ids: list[int] | None = None

    @property
    def estimated_tokens(self) -> int:
        return len(self.head) + round(self.rest_chars / max(self.chars_per_token, 1.0))

    def complete(self) -> list[int]:
        if self._ids is None:
            self._ids = self._finish()
        return self._ids


class SegmentCache:
    """Piece text -> its token ids (uint32), least recently used evicted first; thread-safe."""

    def __init__(self, max_chars: int = MAX_CHARS, max_entries: int = MAX_ENTRIES) -> None:
        if max_chars < 1 or max_entries < 1:
            raise ValueError("max_chars and max_entries must be at least 1")
        self.max_chars = max_chars
        self.max_entries = max_entries
        self.chars = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, array] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get_many(self, pieces: list[str]) -> list[array | None]:
        """Each piece's ids, or None where not cached (the found ones become the most recent)."""
        found: list[array | None] = []
        with self._lock:
            entries = self._entries
            for piece in pieces:
                ids = entries.get(piece) if piece else _EMPTY
                if ids is None:
                    self.misses += 1
                elif piece:
                    entries.move_to_end(piece)
                    self.hits += 1
                found.append(ids)
        return found

    def put(self, piece: str, ids: array) -> None:
        if len(piece) > self.max_chars // 4:
            return          # would evict a quarter of the cache for one prompt
        with self._lock:
            if piece in self._entries:
                self._entries.move_to_end(piece)
                return
            self._entries[piece] = ids
            self.chars += len(piece)
            while self.chars > self.max_chars or len(self._entries) > self.max_entries:
                old, _ = self._entries.popitem(last=False)
                self.chars -= len(old)


class SegmentTokenizer:
    """Encodes text as the wrapped tokenizer does, reusing the ids of pieces seen before."""

    def __init__(self, split: re.Pattern[str], token_ids: dict[str, int],
                 wrap: tuple[tuple[int, ...], tuple[int, ...]] | None, cache: SegmentCache) -> None:
        self._split = split            # matches the added tokens the tokenizer extracts from raw text
        self._token_ids = token_ids    # their ids
        self._wrap = wrap              # (before, after): add_special_tokens's ids; None: not learnt
        self.cache = cache
        self.exact_cuts = False        # whether a long piece may be tokenized head first (_check)

    @classmethod
    def build(cls, tokenizer: Any, *, max_chars: int = MAX_CHARS,
              max_entries: int = MAX_ENTRIES) -> SegmentTokenizer | None:
        """One for `tokenizer` (a transformers fast tokenizer), or None when its pieces do not
        tokenize exactly as the whole text (see the module docstring). Blocking: a few ms."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        reason = _unsplittable(tokenizer, backend)
        if reason is None:
            tokens = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if not t.normalized}
            # Longest first: at one position the regex takes the first alternative that matches,
            # as the tokenizer's leftmost-longest match does.
            alternatives = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
            candidate = cls(re.compile(f"({alternatives})"), tokens, None, SegmentCache(max_chars, max_entries))
            reason = candidate._check(tokenizer, list(tokens))
            if reason is None:
                return candidate
        logger.info("prompts tokenized whole at the router (no piece cache): %s", reason)
        return None

    def encode(self, backend: Any, text: str, *, add_special_tokens: bool,
               head_chars: int = 0) -> list[int] | PartialIds | None:
        """`text`'s ids through `backend` (what `encode` of a `tokenizers.Tokenizer` does), or None
        when `add_special_tokens` adds ids this class cannot place (tokenize the whole text).

        `head_chars` > 0: the first piece not cached that is over twice as long is tokenized only
        up to an exact cut near `head_chars` characters (router/prompt/head_cut.py), and the answer is a
        PartialIds whose `head` is the whole text's leading ids; the rest waits for `complete()`.
        Tokenizers whose cuts are not exact answer the whole list, as with 0."""
        wrap = self._wrap if add_special_tokens else ((), ())
        if wrap is None:
            return None
        parts = self._split.split(text)    # piece, token, piece, ..., piece (pieces may be empty)
        found = self.cache.get_many(parts[0::2])
        return self._join(backend, parts, found, 0, array("I", wrap[0]), wrap[1],
                          head_chars if self.exact_cuts else 0)

    def _join(self, backend: Any, parts: list[str], found: list[array | None], start: int, out: array,
              after: tuple[int, ...], head_chars: int) -> list[int] | PartialIds:
        """`out` extended with the ids of pieces `start`... (tokenizing the missing ones) and the
        tokens between them, then `after`; a PartialIds where a long missing piece is cut."""
        token_ids = self._token_ids
        for i in range(start, len(found)):
            ids = found[i]
            if ids is None:
                piece = parts[2 * i]
                cut = head_cut.cut_before(piece, head_chars) if head_chars and len(piece) > 2 * head_chars else 0
                if cut:
                    head = array("I", backend.encode(piece[:cut], add_special_tokens=False).ids)

                    def finish(i: int = i, piece: str = piece, cut: int = cut, head: array = head,
                               out: array = array("I", out)) -> list[int]:
                        whole = found[i] = head + array("I", backend.encode(piece[cut:], add_special_tokens=False).ids)
                        self.cache.put(piece, whole)
                        return self._join(backend, parts, found, i, out, after, 0)

                    rest_chars = len(piece) - cut + sum(len(p) for p in parts[2 * i + 1:])
                    return PartialIds((out + head).tolist(), rest_chars, cut / max(1, len(head)), finish)
                # One piece at a time on this thread: encode_batch would hand the pieces to the
                # tokenizers thread pool, which measured slower here (a fresh 2,000-token chat: P50
                # 3.3 ms against 2.6 ms whole, on the 2-core VM; benchmarks/router_decision.py).
                ids = found[i] = array("I", backend.encode(piece, add_special_tokens=False).ids)
                self.cache.put(piece, ids)
            out.extend(ids)
            if 2 * i + 1 < len(parts):
                out.append(token_ids[parts[2 * i + 1]])
        out.extend(after)
        return out.tolist()

    def _check(self, tokenizer: Any, tokens: list[str]) -> str | None:
        """Probe texts' ids pieced together against the tokenizer's own (None: all equal); learns
        the ids `add_special_tokens` puts around a text."""
        backend = tokenizer.backend_tokenizer
        probes = _probes(tokens)
        plain = [list(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in probes]
        for probe, expected in zip(probes, plain):
            if self.encode(backend, probe, add_special_tokens=False) != expected:
                return f"pieces of {probe!r} tokenize otherwise than the whole text"
        self._wrap = _learn_wrap([list(tokenizer(p, add_special_tokens=True)["input_ids"]) for p in probes], plain)
        if self._wrap is None:
            logger.info("the router tokenizes whole texts where special tokens are added: the post-processor "
                        "does more than add ids around a text")
        self.cache = SegmentCache(self.cache.max_chars, self.cache.max_entries)  # no probe pieces kept
        why_not = head_cut.exact_cuts(backend)
        self.exact_cuts = why_not is None
        if why_not is not None:
            logger.info("the router tokenizes long new pieces whole (no head first): %s", why_not)
        return None


def _unsplittable(tokenizer: Any, backend: Any) -> str | None:
    """Why `tokenizer`'s pieces may tokenize otherwise than its whole texts (None: no known reason)."""
    if backend is None or not hasattr(backend, "get_added_tokens_decoder"):
        return "not a fast (tokenizers) tokenizer"
    if getattr(tokenizer, "split_special_tokens", False) or getattr(backend, "encode_special_tokens", False):
        return "special tokens are not extracted (split_special_tokens)"
    raw = [t for t in backend.get_added_tokens_decoder().values() if not t.normalized]
    if not raw:
        return "no added tokens to split at"
    stripped = [t.content for t in raw if t.lstrip or t.rstrip or t.single_word]
    if stripped:
        return f"added tokens {stripped[:3]} strip spaces or match single words"
    config = json.loads(backend.to_str())
    for part in ("normalizer", "pre_tokenizer"):
        if _first_piece_only(config.get(part)):
            return f"the {part} treats a text's first piece apart (prepend_scheme first)"
    return None


def _first_piece_only(component: Any) -> bool:
    """Whether a normalizer or pre-tokenizer config (nested Sequences included) prepends to the
    text's first piece only."""
    if isinstance(component, dict):
        if str(component.get("prepend_scheme", "")).lower() == "first":
            return True
        return any(_first_piece_only(value) for value in component.values())
    if isinstance(component, list):
        return any(_first_piece_only(value) for value in component)
    return False


def _probes(tokens: list[str]) -> list[str]:
    """Texts that put each extracted token where splitting could go wrong."""
    texts = ["plain text, no token", " leading space", "trailing newlines\n\n", "", "  \n\n  "]
    for token in tokens:
        texts += [f"{token}system\nYou are helpful.{token}\n{token}user\n Bonjour 😀 l'été{token}\n",
                  f" {token} spaced {token}", f"\n\n{token}\n\n x{token}{token}", f"a{token}b{token}",
                  f"{token}  数据 1234 ok?{token}\t", f"'s{token}'t don't{token}   ",
                  f"{token}user said hello world{token}assistant"]
    if len(tokens) > 1:
        texts.append("x ".join(tokens) + " end")
    return texts


def _learn_wrap(with_special: list[list[int]], plain: list[list[int]]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids `add_special_tokens` puts before and after every probe's ids, or None when they
    are not the same few ids around each one."""
    wrap = None
    for full, ids in zip(with_special, plain):
        if ids and wrap is None:   # an empty text cannot tell before from after
            start = next((k for k in range(len(full) - len(ids) + 1) if full[k:k + len(ids)] == ids), None)
            if start is None:
                return None
            wrap = (tuple(full[:start]), tuple(full[start + len(ids):]))
    if wrap is None or any(full != [*wrap[0], *ids, *wrap[1]] for full, ids in zip(with_special, plain)):
        return None
    return wrap
