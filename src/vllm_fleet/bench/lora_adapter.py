"""A small LoRA adapter for a model, made with `peft` (the dev extra), for tests and benchmarks.

peft's `init_lora_weights=False` draws both LoRA matrices at random, so unlike a fresh
adapter (B = 0, the base model's output) this one changes what the model answers; `scale`
(the spread of B) sets how much. With the default model, greedy, "The capital of France is":
scale 0.05 left the answer " Paris." unchanged, 0.3 changed it (transformers + peft, 2026-12-01).
Nothing here is trained: the adapter only has to be real and different.
"""

from __future__ import annotations

from pathlib import Path


def make_lora_adapter(folder: str | Path, *, model: str | None = None, rank: int = 8, scale: float = 0.3,
                      seed: int = 0, target_modules: tuple[str, ...] = ("q_proj", "v_proj")) -> str:
    """Write a PEFT adapter of `rank` for `model` (default: the packaged default model) to `folder`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from vllm_fleet.models import resolve_model

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(model).path, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(target_modules), init_lora_weights=False)
    tuned = get_peft_model(base, config)
    with torch.no_grad():
        for name, weight in tuned.named_parameters():
            if "lora_B" in name:
                weight.normal_(0.0, scale)
    tuned.save_pretrained(str(folder))
    return str(folder)
