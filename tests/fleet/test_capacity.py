"""Capacity math against hand-computed values (see each test for the arithmetic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.fleet.capacity import (
    GiB, DeviceSpec, EngineSettings, device_spec, estimate, kv_bytes_per_token, state_bytes_per_sequence,
)
from vllm_fleet.fleet.model_shape import load_shape, shape_from_config

REPO = Path(__file__).resolve().parents[2]
QWEN35_CONFIG = REPO / "benchmarks" / "gpu" / "configs" / "qwen3.5-9b"   # the one the GPU benchmark loads
QWEN3_CONFIG = Path(__file__).parent / "fixtures" / "qwen3-8b"
KiB, MiB = 1024, 1024**2


def qwen35():
    return load_shape("Qwen/Qwen3.5-9B")


def test_grouped_query_kv_per_token_counts_kv_heads():
    # Qwen3-8B: 36 layers × 2 (K,V) × 8 KV heads × 128 dims × 2 bytes = 147,456 B = 144 KiB
    assert kv_bytes_per_token(load_shape("Qwen/Qwen3-8B")) == 144 * KiB
    # Llama-3.1-8B: 32 × 2 × 8 × 128 × 2 = 128 KiB
    assert kv_bytes_per_token(load_shape("llama-3.1-8b")) == 128 * KiB


def test_standard_attention_kv_per_token():
    # No num_key_value_heads: every attention head keeps K and V. 12 × 2 × 12 × 64 × 2 = 36,864
    config = {"hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50257}
    assert kv_bytes_per_token(shape_from_config(config, name="gpt2-like")) == 36864


def test_hybrid_qwen35_kv_only_in_full_attention_layers():
    shape = qwen35()
    assert (shape.num_attention_layers, shape.num_linear_layers) == (8, 24)
    # 8 layers × 2 × 4 KV heads × 256 × 2 B = 32 KiB/token (MACHINE-NOTES)
    assert kv_bytes_per_token(shape) == 32 * KiB


def test_hybrid_qwen35_gated_deltanet_state_per_sequence():
    # per DeltaNet layer: conv (2·16·128 + 32·128) × (4−1) = 24,576 + recurrent 32 × 128 × 128 = 524,288
    # → 548,864 elements × 2 B = 1,097,728 B; × 24 layers = 26,345,472 B ≈ 25.1 MiB
    assert state_bytes_per_sequence(qwen35()) == 26_345_472


def test_local_config_folder_matches_builtin_table():
    local = load_shape(str(QWEN35_CONFIG))
    builtin = qwen35()
    assert kv_bytes_per_token(local) == kv_bytes_per_token(builtin)
    assert state_bytes_per_sequence(local) == state_bytes_per_sequence(builtin)
    assert local.parameter_count() == builtin.parameter_count()


def test_weights_from_parameter_count():
    # Qwen3-8B: embed+lm_head 2×151,936×4,096 + 36 × (MLP 3×4,096×12,288 + attn 4,096×(4,096+2×1,024) + 4,096²)
    expected = 2 * 151936 * 4096 + 36 * (3 * 4096 * 12288 + 4096 * (4096 + 2 * 1024) + 4096 * 4096)
    shape = load_shape(str(QWEN3_CONFIG))
    assert shape.parameter_count() == expected
    assert shape.weight_bytes() == expected * 2


def test_kv_budget_on_a_whole_h200():
    shape = load_shape("Qwen/Qwen3-8B")
    capacity = estimate(shape, device_spec("H200"), EngineSettings(max_model_len=32768, max_num_seqs=64))
    usable = int(143771 * MiB * 0.9)
    assert capacity.kv_budget_bytes == usable - shape.weight_bytes() - capacity.reserve_bytes
    assert capacity.kv_tokens == capacity.kv_budget_bytes // (144 * KiB)
    assert capacity.num_blocks == capacity.kv_tokens // 16
    assert capacity.concurrent_sequences(32768) == capacity.kv_budget_bytes // (32768 * 144 * KiB)
    assert capacity.fits


def test_hybrid_sequences_pay_state_plus_kv():
    capacity = estimate(qwen35(), device_spec("H200"), EngineSettings(max_model_len=8192))
    per_seq = 26_345_472 + 8192 * 32 * KiB
    assert capacity.concurrent_sequences(8192) == capacity.kv_budget_bytes // per_seq


def test_weights_that_do_not_fit_say_what_to_change():
    capacity = estimate(load_shape("Qwen/Qwen3-8B"), device_spec("1g.18gb"))
    assert not capacity.fits
    assert "tensor-parallel" in capacity.problems[0] and "larger device" in capacity.problems[0]


def test_context_that_does_not_fit_names_a_length_that_does():
    # A100 3g.40gb: Qwen3-8B's weights fit but a 40,960-token sequence at 0.5 utilization does not
    capacity = estimate(load_shape("Qwen/Qwen3-8B"), device_spec("3g.40gb"),
                        EngineSettings(gpu_memory_utilization=0.5, max_model_len=40960))
    assert not capacity.fits
    problem = capacity.problems[0]
    suggested = int(problem.split("--max-model-len ")[1].split()[0])
    assert 0 < suggested < 40960
    assert estimate(load_shape("Qwen/Qwen3-8B"), device_spec("3g.40gb"),
                    EngineSettings(gpu_memory_utilization=0.5, max_model_len=suggested)).fits


def test_cpu_kv_space_is_the_budget():
    device = DeviceSpec(name="cpu", kind="cpu", memory_bytes=24 * GiB, kv_cache_space_bytes=1 * GiB)
    capacity = estimate(load_shape("Qwen/Qwen3-8B"), device, EngineSettings(max_model_len=4096))
    assert capacity.kv_tokens == GiB // (144 * KiB)   # 7,281 tokens
    assert capacity.concurrent_sequences(4096) == 1


def test_cpu_memory_overcommit_is_refused():
    device = DeviceSpec(name="cpu", kind="cpu", memory_bytes=8 * GiB, kv_cache_space_bytes=4 * GiB)
    capacity = estimate(load_shape("Qwen/Qwen3-8B"), device, EngineSettings(max_model_len=4096))
    assert not capacity.fits and "--kv-cache-space-gb" in capacity.problems[0]


@pytest.mark.parametrize("name, gib", [("H200", 140.4), ("NVIDIA H100 80GB HBM3", 79.6), ("MIG 2g.35gb", 32.6)])
def test_device_names(name, gib):
    assert device_spec(name).memory_bytes / GiB == pytest.approx(gib, abs=0.1)


def test_unknown_device_is_a_config_error():
    from vllm_fleet.errors import ConfigError

    with pytest.raises(ConfigError, match="MIG profile like 1g.18gb"):
        device_spec("TPU v5")
