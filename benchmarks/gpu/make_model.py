"""A Qwen3.5-9B-shaped model folder for throughput runs: the published config and a stand-in tokenizer.

The weights are random (vLLM's `load_format="dummy"`): the same speed as the real model,
meaningless text. No tokenizer ships with the config, and the machine cannot download one, so
this writes a word-level tokenizer over the model's whole vocabulary (token i is "t<i>"). It
lets every system under test run its normal path, detokenization included, on token-id prompts.

    python benchmarks/gpu/make_model.py [--bench-words] CONFIG_DIR OUT_DIR

`--bench-words` also gives the words of `vllm-fleet bench`'s text prompts ids of their own
(from id 1000 on, in place of "t<id>"), so that text prompts tokenize to as many distinct tokens
as they have words. Gateways that take only text (SMG's /v1/completions refuses token ids) then
get the same work as the others: the same words, the same number of prompt tokens.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


WORDS_FROM_ID = 1000


def make_model(config_dir: Path, out_dir: Path, bench_words: bool = False) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = json.loads((config_dir / "config.json").read_text())
    text = config.get("text_config", config)
    vocab_size = int(text["vocab_size"])
    eos = text.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(config_dir / "config.json", out_dir / "config.json")

    names = [f"t{i}" for i in range(vocab_size)]
    if bench_words:
        from vllm_fleet.bench.workloads import WORDS

        for offset, word in enumerate(dict.fromkeys(WORDS)):
            names[WORDS_FROM_ID + offset] = word
    tokenizer = Tokenizer(models.WordLevel({name: i for i, name in enumerate(names)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": f"t{eos}" if eos is not None else "t0",
        "model_max_length": int(text.get("max_position_embeddings", 262144)),
        "clean_up_tokenization_spaces": False,
    }, indent=1))
    return out_dir


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--bench-words"]
    if len(arguments) != 2:
        sys.exit(__doc__)
    print(make_model(Path(arguments[0]), Path(arguments[1]), bench_words="--bench-words" in sys.argv))
