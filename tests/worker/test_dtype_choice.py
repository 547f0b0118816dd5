"""The worker's default dtype: float32 on every CPU (bf16 changes small models' answers, and is slow
without native bf16), the model's dtype on GPUs; --dtype overrides."""

from __future__ import annotations

import pytest

from vllm_fleet.worker.engines.dtype_choice import choose_dtype, read_cpu_flags

# Trimmed /proc/cpuinfo flag lines: an AVX2-only AMD EPYC VM, an AVX512 CPU without bf16, and
# Sapphire Rapids (AVX512-BF16 and AMX).
AVX2_ONLY = "fpu vme de pse tsc msr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 popcnt aes xsave avx f16c avx2 bmi1 bmi2"
AVX512_NO_BF16 = AVX2_ONLY + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"
SAPPHIRE_RAPIDS = AVX512_NO_BF16 + " avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16"
ARM_WITH_BF16 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm bf16 i8mm"


@pytest.mark.parametrize("flags", [AVX2_ONLY, AVX512_NO_BF16, ""])
@pytest.mark.parametrize("requested", [None, "auto"])
def test_cpu_without_native_bf16_loads_float32(flags, requested):
    choice = choose_dtype(requested, on_cpu=True, cpu_flags=flags.split())
    assert choice.dtype == "float32"
    assert choice.reason == "CPU has no native bf16"


@pytest.mark.parametrize("flags, named", [
    (SAPPHIRE_RAPIDS, "amx_bf16 avx512_bf16"),
    (AVX512_NO_BF16 + " avx512_bf16", "avx512_bf16"),
    (ARM_WITH_BF16, "bf16"),
])
def test_cpu_with_native_bf16_still_loads_float32(flags, named):
    """On AMX the packaged 4-bit model in bf16 answered the demo wrongly (#27): float32 by default,
    and the reason says how to ask for bf16."""
    choice = choose_dtype("auto", on_cpu=True, cpu_flags=flags.split())
    assert choice.dtype == "float32"
    assert f"native bf16 ({named})" in choice.reason and "--dtype bfloat16" in choice.reason


@pytest.mark.parametrize("requested", ["bfloat16", "float16", "float32"])
def test_a_dtype_the_user_named_is_kept(requested):
    assert choose_dtype(requested, on_cpu=True, cpu_flags=AVX2_ONLY.split()).dtype == requested
    assert choose_dtype(requested, on_cpu=False, cpu_flags=()).dtype == requested


def test_gpu_keeps_vllms_auto():
    assert choose_dtype(None, on_cpu=False, cpu_flags=AVX2_ONLY.split()).dtype == "auto"


def test_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: {SAPPHIRE_RAPIDS}\n\n"
                       f"processor\t: 1\nflags\t\t: {SAPPHIRE_RAPIDS}\n")
    assert {"amx_bf16", "avx512_bf16", "avx2"} <= read_cpu_flags(cpuinfo)
    arm = tmp_path / "cpuinfo-arm"
    arm.write_text(f"processor\t: 0\nFeatures\t: {ARM_WITH_BF16}\nCPU implementer\t: 0x41\n")
    assert "bf16" in read_cpu_flags(arm)


def test_unreadable_cpuinfo_means_no_flags(tmp_path):
    assert read_cpu_flags(tmp_path / "missing") == frozenset()
