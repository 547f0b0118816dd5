"""Resuming a stream that another worker started (migration).

The client already has `resume_token_ids`, and the text of every *whole* character in them:
a worker holds back the bytes of a character split across tokens (CJK, emoji) until it is
complete. If the resumed tokens end inside such a character, that character's text is still
owed, and an engine prompt ending in half a character also confuses vLLM's incremental
detokenizer. So we resume from the last whole character and let the engine generate the held
tokens again: their ids are dropped from the stream (the client has them), their text is not
(the client never got it). With greedy decoding the regenerated tokens are the same ones; with
sampling they may differ, and the text stays continuous either way.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_fleet.worker.engines.base import SampleDelta

_REPLACEMENT = "\ufffd"
_WINDOW = 12          # tokens decoded to judge the tail: a UTF-8 character spans at most 4 bytes
_MAX_HELD = 4


def held_tail_length(decode: Callable[[list[int]], str], resume_token_ids: list[int]) -> int:
    """How many trailing tokens belong to a character the client has not received whole."""
    window = resume_token_ids[-_WINDOW:]
    if not window or not decode(window).endswith(_REPLACEMENT):
        return 0
    # Up to all of a short resume: a stream may have sent nothing but half a character.
    for held in range(1, min(_MAX_HELD, len(window)) + 1):
        if not decode(window[:-held]).endswith(_REPLACEMENT):
            return held
    return 0


class HeldTokens:
    """Drops, from the first deltas of a resumed stream, the ids of the held tokens regenerated."""

    def __init__(self, token_ids: list[int]) -> None:
        self.pending = list(token_ids)

    def strip(self, delta: SampleDelta) -> SampleDelta:
        if not self.pending:
            return delta
        ids = delta.token_ids
        matched = 0
        while matched < len(ids) and self.pending and ids[matched] == self.pending[0]:
            self.pending.pop(0)
            matched += 1
        if matched < len(ids):
            self.pending = []  # sampling went another way: pass the rest through unchanged
        delta.token_ids = ids[matched:]
        if delta.logprobs:
            delta.logprobs = delta.logprobs[matched:]
        return delta
