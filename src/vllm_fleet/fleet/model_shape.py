"""The numbers of a model that decide its memory: layers, heads, dims, dtype, layer kinds.

Read from the model's Hugging Face `config.json`, wherever `model_config.find_model_config`
finds it (a local folder, the Hugging Face cache, the hub, or a built-in copy).
Multimodal configs (Qwen3.5) keep the language model under `text_config`; that is what we read.
Only decoder-only dense models and Qwen3.5/Qwen3-Next hybrid attention are modelled; other
architectures (MoE, MLA) are read as dense, which misestimates their weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from vllm_fleet.errors import ConfigError
from vllm_fleet.fleet.model_config import find_model_config

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "float8": 1}

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
    source: str = ""                   # where its config.json came from (ModelConfig.source)
    from_builtin: bool = False         # a built-in copy of the published config, not the model's files

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


def load_shape(model: str | None, *, hf_cache: str | Path | None = None, revision: str | None = None) -> ModelShape:
    """A model's shape from its config.json: a local folder, the HF cache, the hub, or a built-in copy.

    `None` means the default model (the packaged SmolLM2, provisioned on first use).
    `hf_cache` overrides $HF_HUB_CACHE; `revision` is a branch, tag or commit (default main).
    Raises ModelError naming every place looked when none has it.
    """
    if model is None:
        from vllm_fleet.models import resolve_model

        model = resolve_model(None).path
    found = find_model_config(model, hf_cache=hf_cache, revision=revision)
    shape = shape_from_config(found.config, name=found.name, weight_bytes=found.weight_bytes)
    return replace(shape, source=found.source, from_builtin=found.builtin)


def shape_from_config(config: dict, *, name: str, weight_bytes: int = 0) -> ModelShape:
    """Build a shape from config.json content (top level or its `text_config`)."""
    text = config.get("text_config") or config
    try:
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        layers = int(text["num_hidden_layers"])
        vocab = int(text["vocab_size"])
    except KeyError as exc:
        raise ConfigError(f"config.json of {name} lacks {exc.args[0]!r}; is it a decoder-only LLM config?") from None
    kinds = _layer_kinds(text, layers)
    dtype = str(text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    return ModelShape(
        name=name,
        architecture=(config.get("architectures") or ["?"])[0],
        dtype_bytes=_DTYPE_BYTES.get(dtype.replace("torch.", ""), 2),
        vocab_size=vocab,
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
