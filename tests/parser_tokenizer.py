"""A tokenizer folder for parser tests: the default model's tokenizer plus the markup tokens
vLLM's hermes tool parser and qwen3 reasoning parser look for.

qwen3 finds `<think>` / `</think>` / `<tool_call>` / `</tool_call>` by token id (they must be
single tokens, as in Qwen3's vocabulary); hermes matches `<tool_call>` in the text. They are
added as normal (not special) tokens, as Qwen3 has them, so detokenized text keeps them. The
chat template is SmolLM2's ChatML with Qwen3's `enable_thinking` switch: when thinking is off,
the generation prompt ends with an empty `<think></think>` block.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

MARKUP_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)


def build_parser_tokenizer(dest: Path) -> Path:
    """Write the tokenizer folder under `dest` (once) and return it."""
    from transformers import AutoTokenizer

    from model_files import copy_tokenizer_files

    folder = dest / "parser-tokenizer"
    if (folder / "tokenizer.json").exists():
        return folder
    staging = dest / "parser-tokenizer.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    copy_tokenizer_files(staging, chat_template=False)
    tokenizer = AutoTokenizer.from_pretrained(str(staging))
    tokenizer.add_tokens(MARKUP_TOKENS, special_tokens=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(staging))
    staging.rename(folder)
    return folder


@pytest.fixture(scope="session")
def parser_tokenizer_dir(tmp_path_factory) -> Path:
    """The parser-test tokenizer folder, built once per test session."""
    return build_parser_tokenizer(tmp_path_factory.getbasetemp())
