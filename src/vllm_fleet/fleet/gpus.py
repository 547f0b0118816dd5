"""What this machine can run workers on: whole GPUs, MIG instances, or CPU cores.

Discovery asks NVML first (`nvidia-ml-py`, imported lazily so CPU machines need not have it),
then falls back to parsing `nvidia-smi`, and on a machine with no NVIDIA driver at all
returns the CPU (cores this process may use, and memory). Parsers take text so they can be
tested on recorded outputs of real machines (tests/fleet/fixtures/).

`nvidia-smi -L` prints, per GPU, one line and, when MIG is on, one indented line per instance:

    GPU 0: NVIDIA H200 (UUID: GPU-1f2e...)
      MIG 3g.71gb     Device  0: (UUID: MIG-7a1c...)

A GPU in MIG mode is not usable as a whole: CUDA only sees its instances.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from typing import Literal

logger = logging.getLogger(__name__)

MiB = 1024**2
GiB = 1024**3

_GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>GPU-[0-9a-fA-F-]+)\)\s*$")
_MIG_LINE = re.compile(
    r"^\s+MIG (?P<profile>[\w.+]+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>MIG-[\w/-]+)\)\s*$"
)
_PROFILE_MEMORY = re.compile(r"(?P<gb>\d+)gb$")


@dataclass(frozen=True)
class Device:
    """One place a worker can run: a whole GPU, a MIG instance, or a set of CPU cores."""

    kind: Literal["gpu", "mig", "cpu"]
    name: str                              # "NVIDIA H200", "MIG 1g.18gb", "x86_64 CPU"
    uuid: str = ""                         # what CUDA_VISIBLE_DEVICES takes (GPU-... or MIG-...)
    memory_bytes: int = 0                  # device memory (GPU/MIG) or system memory (CPU)
    index: int = 0                         # GPU index, or the MIG device index under its parent
    mig_profile: str = ""                  # "1g.18gb" for MIG instances
    parent_index: int | None = None        # MIG: the GPU it lives on
    parent_uuid: str = ""
    parent_name: str = ""                  # MIG: the GPU model, e.g. "NVIDIA H200"
    mig_enabled: bool = False              # whole GPU: MIG mode on (then only its instances are usable)
    cores: tuple[int, ...] = ()            # CPU: usable core ids

    @property
    def label(self) -> str:
        """How logs, the registry and `vllm-fleet gpus` name it."""
        if self.kind == "mig":
            return f"MIG {self.mig_profile} #{self.index} on GPU {self.parent_index}"
        if self.kind == "gpu":
            return f"GPU {self.index}"
        return f"cpu {format_cores(self.cores)}"


@dataclass(frozen=True)
class Inventory:
    """Everything discovery found, and how (`nvml`, `nvidia-smi` or `cpu`)."""

    source: str
    devices: tuple[Device, ...] = ()
    cpu: Device | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def whole_gpus(self) -> list[Device]:
        """GPUs usable as a whole (MIG mode off)."""
        return [d for d in self.devices if d.kind == "gpu" and not d.mig_enabled]

    @property
    def mig_instances(self) -> list[Device]:
        return [d for d in self.devices if d.kind == "mig"]

    @property
    def has_gpu(self) -> bool:
        return any(d.kind in ("gpu", "mig") for d in self.devices)


def discover() -> Inventory:
    """NVML, else nvidia-smi, else the CPU. Never raises for a missing driver."""
    cpu = cpu_device()
    try:
        devices = nvml_devices()
        return Inventory(source="nvml", devices=tuple(devices), cpu=cpu)
    except Exception as exc:  # no library, no driver, or no GPU: try the next source
        logger.debug("NVML discovery unavailable: %s", exc)
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listing = _run([smi, "-L"])
            query = _run([smi, "--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader,nounits"])
            return Inventory(source="nvidia-smi", devices=tuple(parse_nvidia_smi(listing, query)), cpu=cpu)
        except (OSError, subprocess.SubprocessError) as exc:
            logger.warning("nvidia-smi is installed but failed (%s); treating this machine as CPU-only", exc)
    return Inventory(source="cpu", devices=(), cpu=cpu)


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


# ---------------------------------------------------------------------------------------------
# nvidia-smi


def parse_nvidia_smi(listing: str, query_csv: str = "") -> list[Device]:
    """Devices from `nvidia-smi -L`, with whole-GPU memory from the `--query-gpu` CSV.

    MIG instance memory is not in either output; it is taken from the profile name
    (`3g.71gb` → 71 GB), which NVIDIA rounds, so capacity math on it is an estimate.
    """
    memory_by_uuid = _parse_query_memory(query_csv)
    devices: list[Device] = []
    gpu: Device | None = None
    gpu_position = -1
    for line in listing.splitlines():
        if not line.strip():
            continue
        if match := _GPU_LINE.match(line):
            gpu = Device(
                kind="gpu", name=match["name"].strip(), uuid=match["uuid"], index=int(match["index"]),
                memory_bytes=memory_by_uuid.get(match["uuid"], 0),
            )
            gpu_position = len(devices)
            devices.append(gpu)
        elif (match := _MIG_LINE.match(line)) and gpu is not None:
            if not gpu.mig_enabled:
                gpu = devices[gpu_position] = replace(gpu, mig_enabled=True)
            devices.append(Device(
                kind="mig", name=f"MIG {match['profile']}", uuid=match["uuid"], index=int(match["index"]),
                mig_profile=match["profile"], memory_bytes=profile_memory_bytes(match["profile"]),
                parent_index=gpu.index, parent_uuid=gpu.uuid, parent_name=gpu.name,
            ))
        else:
            logger.debug("nvidia-smi -L: ignoring line %r", line)
    return devices


def _parse_query_memory(query_csv: str) -> dict[str, int]:
    """`index, name, uuid, memory.total[MiB]` lines → {uuid: bytes}."""
    memory: dict[str, int] = {}
    for line in query_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[3].isdigit():
            continue
        memory[parts[2]] = int(parts[3]) * MiB
    return memory


def profile_memory_bytes(profile: str) -> int:
    """Memory of a MIG profile from its name: `1g.18gb` → 18 GB (decimal, as NVIDIA names them)."""
    match = _PROFILE_MEMORY.search(profile)
    return int(match["gb"]) * 10**9 if match else 0


# ---------------------------------------------------------------------------------------------
# NVML


def nvml_devices() -> list[Device]:
    """Devices through NVML (exact memory for MIG instances too). Raises if NVML is unusable."""
    import pynvml  # nvidia-ml-py; lazy: CPU machines do not need it

    pynvml.nvmlInit()
    try:
        devices: list[Device] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            devices.extend(_nvml_gpu(pynvml, index))
        return devices
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_gpu(pynvml, index: int) -> list[Device]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    try:
        mig_enabled = pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    except pynvml.NVMLError:  # GPUs without MIG support
        mig_enabled = False
    gpu = Device(
        kind="gpu", name=_text(pynvml.nvmlDeviceGetName(handle)), uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        index=index, memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), mig_enabled=mig_enabled,
    )
    devices = [gpu]
    if not mig_enabled:
        return devices
    for mig_index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
        except pynvml.NVMLError:  # empty slot
            continue
        name = _text(pynvml.nvmlDeviceGetName(mig))  # e.g. "NVIDIA H200 MIG 1g.18gb"
        profile = name.rsplit("MIG", 1)[-1].strip() if "MIG" in name else name
        devices.append(Device(
            kind="mig", name=f"MIG {profile}", uuid=_text(pynvml.nvmlDeviceGetUUID(mig)), index=mig_index,
            mig_profile=profile, memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(mig).total),
            parent_index=index, parent_uuid=gpu.uuid, parent_name=gpu.name,
        ))
    return devices


# ---------------------------------------------------------------------------------------------
# CPU


def cpu_device() -> Device:
    """The cores this process may run on, and the machine's memory."""
    cores = tuple(sorted(os.sched_getaffinity(0)))
    return Device(kind="cpu", name=f"{os.uname().machine} CPU", memory_bytes=_meminfo("MemTotal"), cores=cores)


def available_memory_bytes() -> int:
    return _meminfo("MemAvailable")


def _meminfo(key: str) -> int:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                name, _, rest = line.partition(":")
                if name == key:
                    return int(rest.split()[0]) * 1024
    except OSError:
        pass
    return 0


def format_cores(cores: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) → "0-2,5": the syntax VLLM_CPU_OMP_THREADS_BIND and taskset take."""
    ranges: list[str] = []
    ordered = sorted(cores)
    start = prev = None
    for core in ordered + [None]:
        if start is not None and (core is None or core != prev + 1):
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if core is not None and start is None:
            start = core
        prev = core
    return ",".join(ranges)
