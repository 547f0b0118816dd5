"""The mock engine's vocabulary and its deterministic choice of the next token (mock_engine.py).

A small vocabulary: ids 0..3 are specials, then words, some of them non-ASCII so that UTF-8
handling is exercised even without the real engine. Without a real tokenizer a prompt is one
token per whitespace-separated word (`word_tokens`). Each generated token depends only on the
two before it (`mock_next_token`), steered by the request's sampling parameters (`MockSampling`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

SPECIALS = ["<eos>", "<bos>", "<|user|>", "<|assistant|>"]
_WORDS = (
    "the of and to in is was for on that with as by at from his her an were are which this be "
    "river mountain city light green north 北京 数据 流 😀 café naïve über λ model fleet token"
).split()
VOCAB = SPECIALS + [" " + w for w in _WORDS]
EOS = 0


@dataclass(frozen=True, slots=True)
class MockSampling:
    """What of vLLM's sampling parameters steers the mock's hashed tokens."""

    forced: int | None = None              # logit_bias of +100 or more: always this token
    banned: frozenset[int] = frozenset()   # logit_bias of -100 or less: never these
    allowed: tuple[int, ...] = ()          # allowed_token_ids: only these ("" = every word)
    seed: int | None = None

    @classmethod
    def of(cls, params: Any) -> MockSampling:
        bias = getattr(params, "logit_bias", None) or {}
        forced = [token for token, value in bias.items() if value >= 100]
        return cls(
            forced=max(forced, key=lambda token: bias[token]) if forced else None,
            banned=frozenset(token for token, value in bias.items() if value <= -100),
            allowed=tuple(sorted(getattr(params, "allowed_token_ids", None) or ())),
            seed=getattr(params, "seed", None),
        )


GREEDY = MockSampling()


def mock_next_token(previous: list[int], sample: int, first: bool, adapter: str = "",
                    sampling: MockSampling = GREEDY) -> int:
    """The deterministic next token after `previous` (the prompt plus what was generated).

    It depends only on the last two tokens (and, for the first answer token, the sample
    number), so a stream resumed elsewhere from prompt + tokens-so-far continues exactly as
    the uninterrupted one would. A LoRA adapter's name salts every token: an adapter answers
    differently from the base model, and the same on every worker that holds it. `sampling`
    steers the choice as the request's sampling parameters ask.
    """
    if sampling.forced is not None:
        return sampling.forced
    a = previous[-1] if previous else 0
    b = previous[-2] if len(previous) > 1 else 0
    salt = sample if first else 0
    key = f"{a}:{b}:{salt}" if not adapter else f"{a}:{b}:{salt}:{adapter}"
    if sampling.seed is not None:
        key += f":seed{sampling.seed}"
    candidates = sampling.allowed or range(len(SPECIALS), len(VOCAB))
    for attempt in range(len(candidates)):
        digest = hashlib.blake2b(f"{key}:{attempt}".encode() if attempt else key.encode(), digest_size=4).digest()
        token = candidates[int.from_bytes(digest, "little") % len(candidates)]
        if token not in sampling.banned:
            return token
    return token  # every candidate banned: vLLM would sample one anyway


def word_tokens(text: str) -> list[int]:
    """One mock token per whitespace-separated word, hashed into the vocabulary."""
    return [len(SPECIALS) + (hash_word(w) % len(_WORDS)) for w in text.split()]


def hash_word(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
