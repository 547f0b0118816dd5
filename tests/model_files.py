"""The packaged default model's files, for tests: where they are, copies of its tokenizer files
(the folder a mock engine's `mock_tokenizer` and a router's tokenizer load), and vLLM's renderer
on a folder as a running worker has it.

The `tokenizer_folder` fixture (tests/conftest.py) is such a copy, one per test module.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

from vllm_fleet.models import resolve_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def default_model_folder() -> Path:
    return Path(resolve_model(None, None).path)


def copy_tokenizer_files(dest: Path, *, chat_template: bool = True) -> Path:
    """Copy the default model's tokenizer files (and its chat template, unless told not to) into
    `dest`, an existing folder; returns `dest`."""
    source = default_model_folder()
    for name in TOKENIZER_FILES + ((CHAT_TEMPLATE_FILE,) if chat_template else ()):
        shutil.copy(source / name, dest / name)
    return dest


def worker_renderer(folder: Path, **model_config):
    """What a running worker renders with (AsyncLLM.renderer in a VllmRenderer), built without an
    engine from the model in `folder`; `model_config`: more of vLLM's ModelConfig (max_model_len)."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers import renderer_from_config

    from vllm_fleet.worker.openai.render import VllmRenderer

    config = VllmConfig(model_config=ModelConfig(model=str(folder), tokenizer=str(folder), **model_config))
    renderer = renderer_from_config(config)
    return VllmRenderer(SimpleNamespace(renderer=renderer, vllm_config=config), renderer.get_tokenizer())
