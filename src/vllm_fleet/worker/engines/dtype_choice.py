"""Which weight dtype a worker loads when the user has not chosen one (`--dtype auto`).

vLLM's own `auto` is the model's dtype (bf16 for most current models). On a CPU without native
bf16 instructions that is the slowest choice: measured on a 2-core AVX2-only VM, the default
model ran at ~22 output tokens/s in bf16 against ~120 in float32, and a bf16 linear layer at
~4 GFLOPS against 16-25 for float32 (benchmarks/RESULTS.md). With AVX512-BF16 or AMX (x86) or
the bf16 extension (Arm), bf16 is native and the model's own dtype is kept. GPUs keep vLLM's
`auto`.
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
        return DtypeChoice("auto", f"the model's dtype; CPU has native bf16: {' '.join(native)}")
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
