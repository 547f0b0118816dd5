"""The mock engine's scripted answer: a fixed text, tokenized with a real tokenizer.

With `--mock-tokenizer DIR --mock-script FILE` the mock answers every prompt with the file's
text, so tests can drive the worker's tool-call and reasoning parsers (parsing.py) through
real token ids. The tokens come in engine steps of 1, 3, 2, 4, ... tokens, so deltas end at
awkward places (inside a tool call's JSON, next to `</think>`), and each delta's text is what
an incremental detokenizer gives: whole characters only.

Resume (migration): a prompt that ends with the script's first k tokens (the tokens another
worker already sent) continues at token k, as a real engine continues from prompt + output.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_fleet.errors import ConfigError

STEP_SIZES = (1, 3, 2, 4)
_REPLACEMENT = "\ufffd"


@dataclass(slots=True)
class ScriptStep:
    token_ids: list[int]
    text: str
    finish_reason: str | None


def load_tokenizer(folder: str) -> Any:
    """The tokenizer in `folder`, loaded the way the vLLM engine loads one."""
    from vllm.tokenizers import get_tokenizer

    if not Path(folder, "tokenizer.json").exists() and not Path(folder, "tokenizer_config.json").exists():
        raise ConfigError(f"--mock-tokenizer {folder!r}: no tokenizer files (tokenizer.json) in that folder")
    return get_tokenizer(folder)


class MockScript:
    def __init__(self, tokenizer: Any, text: str) -> None:
        self._tokenizer = tokenizer
        self.token_ids: list[int] = list(tokenizer.encode(text, add_special_tokens=False))
        if not self.token_ids:
            raise ConfigError("--mock-script: the script is empty")

    @classmethod
    def from_file(cls, tokenizer: Any, path: str) -> MockScript:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"--mock-script {path!r} cannot be read: {error}") from error
        return cls(tokenizer, text)

    def resume_offset(self, prompt_token_ids: list[int]) -> int:
        """How many of the script's tokens the prompt already ends with."""
        script = self.token_ids
        for k in range(min(len(script), len(prompt_token_ids)), 0, -1):
            if prompt_token_ids[-k:] == script[:k]:
                return k
        return 0

    def steps(self, prompt_token_ids: list[int], max_tokens: int, skip_special_tokens: bool = True) -> list[ScriptStep]:
        """The engine steps answering `prompt_token_ids`: the script after what the prompt holds."""
        script = self.token_ids
        start = self.resume_offset(prompt_token_ids)
        end = min(len(script), start + max(0, max_tokens))
        sent = self._text(script[:start], skip_special_tokens, final=False)
        steps: list[ScriptStep] = []
        position, turn = start, 0
        while position < end:
            upto = min(end, position + STEP_SIZES[turn % len(STEP_SIZES)])
            done = upto == end
            text = self._text(script[:upto], skip_special_tokens, final=done)
            finish = ("stop" if end == len(script) else "length") if done else None
            steps.append(ScriptStep(script[position:upto], text[len(sent):], finish))
            sent, position, turn = text, upto, turn + 1
        return steps

    def _text(self, token_ids: list[int], skip_special_tokens: bool, final: bool) -> str:
        text = self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        # A character split across tokens is sent once it is whole (as vLLM's detokenizer does).
        return text if final else text.rstrip(_REPLACEMENT)
