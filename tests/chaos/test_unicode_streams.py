"""Scenario 8: Chinese, emoji and rare characters streamed through the gateway from a REAL vLLM
worker (the session's shared one; SmolLM2's Chinese is weak but its bytes are real).

Read as raw bytes off the socket: every SSE event is valid UTF-8 on its own (no character split
across events), no U+FFFD and no lone surrogate anywhere, and the streamed text equals the
non-streamed text for the same greedy request, on /v1/chat/completions and /v1/completions.
Figure: mismatches, streams and events checked, multi-byte characters seen.
"""

from __future__ import annotations

import json

import httpx
import pytest

from support import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

MAX_TOKENS = 24  # 40 took 72 s of one engine; 24 tokens still stream the 20 multi-byte characters asserted below
PROMPTS = [
    "请用中文回答：你最喜欢的食物是什么？为什么？",
    "Translate into Chinese: The weather is nice today and I want to go to the park.",
    "日本語で自己紹介してください。",
    "Repeat exactly: 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🇯🇵 ❤️‍🔥 👍🏿",
    "List five emoji that mean happiness, separated by spaces:",
    "Repeat exactly: 𠀀 𠜎 𪚥 𰻞𰻞面 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚",
    "Repeat exactly: Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ and e\u0301 n\u0303 a\u030a",
    "Translate into Arabic and Hebrew: peace and friendship. مرحبا بالعالم שלום עולם",
]


def _strict(data: bytes, where: str) -> str:
    """Decode strictly; a split or invalid sequence fails the test with the offending bytes."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AssertionError(f"{where}: invalid UTF-8 ({exc}): {data[max(0, exc.start - 20):exc.end + 20]!r}")
    assert "\ufffd" not in text, f"{where}: U+FFFD in {text!r}"
    return text


def _check_text(text: str, where: str) -> str:
    """A JSON string field: no U+FFFD, no lone surrogate (a '\\ud83d' escape of half an emoji)."""
    assert "\ufffd" not in text, f"{where}: U+FFFD in {text!r}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise AssertionError(f"{where}: lone surrogate in {text!r}: {exc}")
    return text


async def _streamed(http: httpx.AsyncClient, path: str, body: dict, where: str) -> tuple[str, str | None, int]:
    """(text, finish_reason, events) of one stream, read from the raw byte stream."""
    buffer, events, text, finish = b"", 0, "", None
    async with http.stream("POST", path, json={**body, "stream": True}) as reply:
        assert reply.status_code == 200, (await reply.aread()).decode(errors="replace")
        async for raw in reply.aiter_raw():
            buffer += raw
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                events += 1
                decoded = _strict(event, f"{where} event {events}")
                assert decoded.startswith("data: "), f"{where}: not an SSE data event: {decoded!r}"
                payload = decoded[len("data: "):]
                if payload == "[DONE]":
                    continue
                data = json.loads(payload)
                assert "error" not in data, f"{where}: error event {data}"
                for choice in data["choices"]:
                    piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
                    text += _check_text(piece or "", f"{where} event {events}")
                    finish = choice.get("finish_reason") or finish
    assert buffer == b"", f"{where}: stream ended inside an event: {buffer!r}"
    return text, finish, events


async def _whole(http: httpx.AsyncClient, path: str, body: dict, where: str) -> tuple[str, str | None]:
    reply = await http.post(path, json={**body, "stream": False})
    assert reply.status_code == 200, reply.text
    choice = json.loads(_strict(reply.content, where))["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return _check_text(text or "", where), choice["finish_reason"]


async def test_unicode_streams_are_whole_characters_and_equal_the_non_streamed_text(start_gateway, vllm_worker):
    server = await start_gateway([vllm_worker.address])
    await wait_until(lambda: len(server.router.models()) == 1, timeout=60, message="the real worker's model")
    model = server.router.models()[0]
    mismatches, streams, events, non_ascii, astral = [], 0, 0, 0, 0
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        for i, prompt in enumerate(PROMPTS):
            for path in ("/v1/chat/completions", "/v1/completions"):
                where = f"prompt {i} {path}"
                body = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0}
                body.update({"messages": [{"role": "user", "content": prompt}]} if "chat" in path else {"prompt": prompt})
                # One at a time, on an otherwise idle engine, after a 1-token request has put the
                # prompt's blocks in the prefix cache: both compared requests then compute the same way.
                await _whole(http, path, {**body, "max_tokens": 1}, where + " (warm-up)")
                streamed, streamed_finish, count = await _streamed(http, path, body, where)
                whole, whole_finish = await _whole(http, path, body, where)
                streams += 1
                events += count
                non_ascii += sum(ord(c) > 127 for c in streamed)
                astral += sum(ord(c) > 0xFFFF for c in streamed)
                if (streamed, streamed_finish) != (whole, whole_finish):
                    mismatches.append(f"{where}:\n  stream {streamed!r} ({streamed_finish})\n"
                                      f"  whole  {whole!r} ({whole_finish})")
    assert not mismatches, "streamed text differs from non-streamed text:\n" + "\n".join(mismatches)
    # Not vacuous: the model did stream multi-byte characters (Chinese, emoji) through the path.
    assert non_ascii >= 20, f"only {non_ascii} non-ASCII characters streamed: the prompts no longer exercise UTF-8"
    print(f"\n[figure] unicode through gateway + real vLLM: {streams} streams, {events} SSE events checked "
          f"(strict UTF-8 per event, no U+FFFD, no lone surrogate); {non_ascii} non-ASCII characters streamed "
          f"({astral} outside the BMP); streamed vs non-streamed mismatches {len(mismatches)}/{streams}")
