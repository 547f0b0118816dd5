"""Finding the tokens of a character the client has not received whole (byte-level tokens)."""

from vllm_fleet.worker.engines.base import SampleDelta
from vllm_fleet.worker.resume.held import HeldTokens, held_tail_length

# A byte-level toy tokenizer: token i is byte i; decoding replaces incomplete characters.
def decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


EMOJI = list("😀".encode())      # 4 tokens
HAN = list("北".encode())        # 3 tokens


def test_nothing_is_held_when_the_resume_ends_on_a_whole_character():
    assert held_tail_length(decode, list(b"ab") + HAN) == 0
    assert held_tail_length(decode, []) == 0


def test_the_partial_character_at_the_end_is_held():
    assert held_tail_length(decode, list(b"ab") + EMOJI[:3]) == 3
    assert held_tail_length(decode, list(b"ab") + HAN + HAN[:1]) == 1


def test_a_resume_that_is_only_half_a_character_is_held_entirely():
    assert held_tail_length(decode, EMOJI[:2]) == 2


def test_regenerated_held_tokens_are_dropped_from_the_stream_once():
    held = HeldTokens(EMOJI[:2])
    first = held.strip(SampleDelta(0, "", EMOJI[:1]))
    second = held.strip(SampleDelta(0, "😀", EMOJI[1:] + [65]))
    third = held.strip(SampleDelta(0, "A", [EMOJI[0]]))
    assert first.token_ids == [] and second.token_ids == EMOJI[2:] + [65]
    assert second.text == "😀"          # the owed text still goes out
    assert third.token_ids == [EMOJI[0]]  # only the first occurrence is the regenerated one


def test_a_different_sample_passes_through_unchanged():
    held = HeldTokens(EMOJI[:2])
    delta = held.strip(SampleDelta(0, "x", [120, 121]))
    assert delta.token_ids == [120, 121] and held.pending == []
