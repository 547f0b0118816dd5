"""Discovery on recorded `nvidia-smi` outputs of A100 / H100 / H200 machines, with and without MIG."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.fleet.gpus import Inventory, cpu_device, discover, format_cores, parse_nvidia_smi

FIXTURES = Path(__file__).parent / "fixtures"
MiB = 1024**2


def recorded(name: str) -> Inventory:
    listing = (FIXTURES / f"{name}.L.txt").read_text()
    query = (FIXTURES / f"{name}.query.csv").read_text()
    return Inventory(source="nvidia-smi", devices=tuple(parse_nvidia_smi(listing, query)))


def test_whole_h200s_have_name_uuid_and_memory():
    inventory = recorded("h200_nomig")
    assert [d.label for d in inventory.whole_gpus] == ["GPU 0", "GPU 1"]
    gpu = inventory.whole_gpus[1]
    assert gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-8e2a1d47-55c3-b0e9-4f7d-2a9c6b1e3f58"
    assert gpu.memory_bytes == 143771 * MiB
    assert inventory.mig_instances == []


def test_mixed_h200_node_lists_mig_instances_with_profile_and_parent():
    inventory = recorded("h200_mig")
    # GPU 0 is in MIG mode: only its instances are usable; GPU 1 stays whole.
    assert [d.label for d in inventory.whole_gpus] == ["GPU 1"]
    migs = inventory.mig_instances
    assert [m.mig_profile for m in migs] == ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]
    assert {m.parent_index for m in migs} == {0}
    assert migs[2].uuid == "MIG-a7c31e95-2d64-5f08-b3e9-4c7a1d6f2e85"
    assert migs[2].parent_uuid == "GPU-3c6b7c0e-9d41-8a2f-61b5-0f2d7e4a9c10"
    assert migs[2].parent_name == "NVIDIA H200"
    assert migs[0].memory_bytes == 71 * 10**9
    assert migs[3].label == "MIG 1g.18gb #3 on GPU 0"


def test_h100_split_into_seven_slices():
    inventory = recorded("h100_mig")
    assert inventory.whole_gpus == []
    assert len(inventory.mig_instances) == 7
    assert {m.mig_profile for m in inventory.mig_instances} == {"1g.10gb"}
    assert len({m.uuid for m in inventory.mig_instances}) == 7


def test_h100_whole_gpus():
    inventory = recorded("h100_nomig")
    assert [g.name for g in inventory.whole_gpus] == ["NVIDIA H100 80GB HBM3"] * 4
    assert all(g.memory_bytes == 81559 * MiB for g in inventory.whole_gpus)


def test_a100_mig_uuids_in_old_and_new_driver_formats():
    inventory = recorded("a100_mig")
    uuids = [m.uuid for m in inventory.mig_instances]
    assert uuids[0] == "MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/1/0"
    assert uuids[2] == "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
    assert [m.parent_index for m in inventory.mig_instances] == [0, 0, 1, 1]
    assert all(m.mig_profile == "3g.40gb" for m in inventory.mig_instances)


def test_listing_without_query_still_finds_devices():
    devices = parse_nvidia_smi((FIXTURES / "h200_nomig.L.txt").read_text())
    assert [d.uuid for d in devices][0].startswith("GPU-3c6b")
    assert devices[0].memory_bytes == 0  # unknown until the query says


def test_cpu_machine_reports_cores_and_memory():
    inventory = discover()
    if inventory.has_gpu:
        pytest.skip("this machine has a GPU")
    assert inventory.source == "cpu"
    assert inventory.cpu.cores and inventory.cpu.memory_bytes > 0
    assert cpu_device().label.startswith("cpu ")


@pytest.mark.parametrize("cores, text", [((0,), "0"), ((0, 1, 2, 5), "0-2,5"), ((1, 3), "1,3"), ((), "")])
def test_core_lists_use_the_bind_syntax(cores, text):
    assert format_cores(cores) == text


def test_output_recorded_on_a_real_h200():
    # Recorded 2026-11-30 (driver 580.159.04); NVML on the same machine reported the same
    # name, UUID and 150,754,820,096 bytes, which is what this parse must agree with.
    inventory = recorded("h200_recorded")
    (gpu,) = inventory.whole_gpus
    assert (gpu.name, gpu.uuid, gpu.memory_bytes) == (
        "NVIDIA H200", "GPU-db6efce2-9109-5d84-cc7c-85f99424970e", 150_754_820_096)
