"""Where a piece of text can be cut so that its two parts tokenize as the whole does.

Why: the router's cache lookup walks a prompt's chained block keys from the start and stops at
the first block no worker holds; the keys past it cannot change the decision. For a long piece
of new text (a fresh document) most of the tokenizer's time goes on ids past that block. If the
piece can be cut exactly, the router tokenizes a head of it first and the rest only when every
block of the head is held somewhere (router/prompt/segments.py, `SegmentTokenizer.encode`).

The cut: right after an ASCII letter followed by a space ("word| next"). For a byte-level BPE
tokenizer (GPT-2's pre-tokenizer regex and its descendants: SmolLM2, Qwen2, Llama 3) this is
always a pre-token boundary, and the regex matching of the text before it never looks past it:
the pre-token holding the letter is a letter run (or a contraction such as "'s"), which ends at
the space whether a space or the end of the text follows; every earlier pre-token ends before
it. The regexes have no look-behind, so the text after it is split from there as in the whole
text, and BPE merges never cross pre-tokens. A normalizer other than NFC could change that (NFC
composes a letter only with combining marks after it, never with a following space).

Not every tokenizer is like this, so `exact_cuts` answers True only for a byte-level pre-tokenizer
with no normalizer or NFC whose ids of probe texts (non-ASCII, newlines, runs of spaces,
contractions, digits) cut at every such place equal the whole texts' ids. Otherwise pieces are
tokenized whole, as before.
"""

from __future__ import annotations

import json
from typing import Any

_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

_PROBES = (
    "The quick brown fox jumps over the lazy dog, twice.\n\nThen it rests  here   and\tthere.",
    "don't stop: it's what we'll do, they've said; I'm sure you'd agree 's 't",
    "données été 数据 résumé naïve café Ελληνικά русский текст ok then",
    "numbers 1234 56789 x1 y22 and 3.14159 or 1,000,000 end",
    "lines\nwith\nbreaks \n and  \n\n  spaces    between     words and\r\nCRLF too",
    "emoji 😀 here and 👍🏽 there, tabs\t\tand a e\u0301 combining accent",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "   leading spaces then words and trailing spaces   ",
    "CamelCase words, ALLCAPS WORDS and snake_case_names or kebab-case-names here",
    "quotes \"like this\" and 'this' or (parens) [brackets] {braces} <angle> done",
)


def cut_before(text: str, limit: int) -> int:
    """The last exact cut at or before `limit` (0 < cut < len(text)), or 0 when there is none."""
    b = text.rfind(" ", 1, min(limit, len(text) - 1) + 1)
    while b > 0 and text[b - 1] not in _LETTERS:
        b = text.rfind(" ", 1, b)
    return max(b, 0)


def all_cuts(text: str) -> list[int]:
    """Every exact cut of `text`, in order."""
    return [b for b in range(1, len(text)) if text[b] == " " and text[b - 1] in _LETTERS]


def exact_cuts(backend: Any) -> str | None:
    """Why `backend` (a `tokenizers.Tokenizer`) may tokenize cut text otherwise than the whole
    (None: cuts are exact on every probe). Blocking: a few ms."""
    config = json.loads(backend.to_str())
    normalizer = config.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return f"a {normalizer.get('type')} normalizer"
    if '"ByteLevel"' not in json.dumps(config.get("pre_tokenizer")):
        return "not a byte-level pre-tokenizer"
    for probe in _PROBES:
        whole = backend.encode(probe, add_special_tokens=False).ids
        cuts = [0, *all_cuts(probe), len(probe)]
        parts = [i for a, b in zip(cuts, cuts[1:]) for i in backend.encode(probe[a:b], add_special_tokens=False).ids]
        if parts != whole:
            return f"{probe!r} cut after letters tokenizes otherwise than whole"
    return None
