"""The numbers of a model that decide its memory: layers, heads, dims, dtype, layer kinds.

Read from a Hugging Face `config.json` (a local folder), or from a built-in table for common
models so `vllm-fleet plan --model Qwen/Qwen3.5-9B` works on a machine with no hub access.
Multimodal configs (Qwen3.5) keep the language model under `text_config`; that is what we read.
Only decoder-only dense models and Qwen3.5/Qwen3-Next hybrid attention are modelled; other
architectures (MoE, MLA) are read as dense, which misestimates their weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet.errors import ConfigError

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "float8": 1}

# The fields that matter, from the models' published config.json files.
BUILTIN_CONFIGS: dict[str, dict] = {
    "Qwen/Qwen3.5-9B": {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {
            "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
            "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
            "linear_num_value_heads": 32, "full_attention_interval": 4, "max_position_embeddings": 262144,
            "tie_word_embeddings": False, "dtype": "bfloat16",
        },
    },
    "Qwen/Qwen3-8B": {
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "meta-llama/Llama-3.1-8B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
}
_ALIASES = {
    "qwen3.5-9b": "Qwen/Qwen3.5-9B", "qwen3-8b": "Qwen/Qwen3-8B", "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
}


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of one model (per whole model, before tensor-parallel sharding)."""

    name: str
    architecture: str
    dtype_bytes: int
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int
    tie_embeddings: bool
    num_attention_layers: int          # layers that keep a KV cache growing with the sequence
    num_linear_layers: int = 0         # Gated DeltaNet layers: a fixed state per sequence
    attn_output_gate: bool = False     # Qwen3.5/Qwen3-Next: q_proj also produces a gate
    linear_conv_kernel: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    weight_bytes_on_disk: int = 0      # exact, from model.safetensors.index.json, when known

    @property
    def is_hybrid(self) -> bool:
        return self.num_linear_layers > 0

    def parameter_count(self) -> int:
        """Parameters of the language model (norms and biases left out: < 0.1%)."""
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)
        mlp = 3 * self.hidden_size * self.intermediate_size
        q_out = self.num_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        attention = self.hidden_size * (q_out + 2 * self.num_kv_heads * self.head_dim) + \
            self.num_heads * self.head_dim * self.hidden_size
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        linear = self.hidden_size * (2 * key_dim + 2 * value_dim + 2 * self.linear_num_value_heads) + \
            (2 * key_dim + value_dim) * self.linear_conv_kernel + value_dim * self.hidden_size
        return embed + self.num_layers * mlp + self.num_attention_layers * attention + self.num_linear_layers * linear

    def weight_bytes(self) -> int:
        return self.weight_bytes_on_disk or self.parameter_count() * self.dtype_bytes


def load_shape(model: str | None) -> ModelShape:
    """A model's shape from a local folder (its config.json) or the built-in table.

    `None` means the default model (the packaged SmolLM2, provisioned on first use).
    """
    if model is None:
        from vllm_fleet.models import resolve_model

        model = resolve_model(None).path
    folder = Path(model).expanduser()
    if (folder / "config.json").exists():
        config = json.loads((folder / "config.json").read_text())
        return shape_from_config(config, name=folder.name, weight_bytes=_safetensors_bytes(folder))
    key = _ALIASES.get(model.lower(), model)
    if key in BUILTIN_CONFIGS:
        return shape_from_config(BUILTIN_CONFIGS[key], name=key)
    known = ", ".join(BUILTIN_CONFIGS)
    raise ConfigError(
        f"no config.json for model {model!r}: pass a local model folder, or one of the built-in models ({known})"
    )


def shape_from_config(config: dict, *, name: str, weight_bytes: int = 0) -> ModelShape:
    """Build a shape from config.json content (top level or its `text_config`)."""
    text = config.get("text_config") or config
    try:
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        layers = int(text["num_hidden_layers"])
    except KeyError as exc:
        raise ConfigError(f"config.json of {name} lacks {exc.args[0]!r}; is it a decoder-only LLM config?") from None
    kinds = _layer_kinds(text, layers)
    dtype = str(text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    return ModelShape(
        name=name,
        architecture=(config.get("architectures") or ["?"])[0],
        dtype_bytes=_DTYPE_BYTES.get(dtype.replace("torch.", ""), 2),
        vocab_size=int(text["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(text.get("intermediate_size") or 4 * hidden),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        max_position=int(text.get("max_position_embeddings") or 2048),
        tie_embeddings=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        num_attention_layers=kinds.count("attention"),
        num_linear_layers=kinds.count("linear"),
        attn_output_gate=bool(text.get("attn_output_gate", "full_attention_interval" in text)),
        linear_conv_kernel=int(text.get("linear_conv_kernel_dim") or 0),
        linear_key_head_dim=int(text.get("linear_key_head_dim") or 0),
        linear_value_head_dim=int(text.get("linear_value_head_dim") or 0),
        linear_num_key_heads=int(text.get("linear_num_key_heads") or 0),
        linear_num_value_heads=int(text.get("linear_num_value_heads") or 0),
        weight_bytes_on_disk=weight_bytes,
    )


def _layer_kinds(text: dict, layers: int) -> list[str]:
    """'attention' or 'linear' per layer, from `layer_types` or `full_attention_interval`.

    Sliding-window layers count as attention (an upper bound on their KV cache).
    """
    if text.get("layer_types"):
        return ["linear" if kind == "linear_attention" else "attention" for kind in text["layer_types"]]
    interval = text.get("full_attention_interval")
    if interval:
        # Qwen3.5: every `interval`-th layer is full attention, the others Gated DeltaNet.
        return ["attention" if (i + 1) % int(interval) == 0 else "linear" for i in range(layers)]
    return ["attention"] * layers


def _safetensors_bytes(folder: Path) -> int:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return int(json.loads(index.read_text()).get("metadata", {}).get("total_size") or 0)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
