"""Which weight dtype a worker loads when the user has not chosen one (`--dtype auto`).

vLLM's own `auto` is the model's dtype (bf16 for most current models). On CPU the worker loads
float32 instead, on every CPU:
- without native bf16 instructions (AVX2 only) bf16 is the slowest choice: measured on a 2-core
  AVX2-only VM, the default model ran at ~22 output tokens/s in bf16 against ~120 in float32
  (benchmarks/RESULTS.md);
- with native bf16 (AVX512-BF16, AMX) bf16 is faster, but the answers change: the packaged
  4-bit SmolLM2-135M, kept in bf16 on an AMX machine, answered the demo's "What is the capital
  of France?" with a repeated phrase and its Chinese question with nonsense, where float32
  answers both correctly (#27). A default that answers right on every machine beats one that is
  fast on some; `--dtype bfloat16` keeps the speed where the model tolerates it.
GPUs keep vLLM's `auto`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# CPU flags (x86 `flags`, Arm `Features` in /proc/cpuinfo) that mean bf16 math is native.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str   # what vLLM is given: "auto" (the model's dtype) or an explicit dtype
    reason: str  # short, for logs and the demo: why this one


def choose_dtype(requested: str | None, *, on_cpu: bool, cpu_flags: Iterable[str]) -> DtypeChoice:
    """The dtype to load: the user's when they named one, else the fastest the device runs."""
    if requested and requested != "auto":
        return DtypeChoice(requested, "set by --dtype")
    if not on_cpu:
        return DtypeChoice("auto", "the model's dtype")
    native = sorted(NATIVE_BF16_FLAGS.intersection(cpu_flags))
    if native:
        return DtypeChoice("float32", f"CPU default; native bf16 ({' '.join(native)}) is faster but changes "
                                      "small models' answers: --dtype bfloat16 to use it")
    return DtypeChoice("float32", "CPU has no native bf16")


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags; empty where /proc/cpuinfo is missing (then float32 is chosen)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()
