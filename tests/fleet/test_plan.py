"""Placement on recorded machines: MIG, tensor parallel, mixed layouts, CPU cores."""

from __future__ import annotations

import pytest

from test_gpus import recorded
from vllm_fleet.cli import build_parser
from vllm_fleet.config import EngineConfig, WorkerConfig, from_args
from vllm_fleet.errors import ConfigError
from vllm_fleet.fleet.config import PlanConfig
from vllm_fleet.fleet.gpus import Device, Inventory
from vllm_fleet.fleet.model_shape import load_shape, shape_from_config
from vllm_fleet.fleet.plan import build_plan
from vllm_fleet.fleet.worker_process import WorkerProcess

GiB = 1024**3
SMOLLM2 = shape_from_config({  # the default model's published config
    "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16"}, name="SmolLM2-135M-Instruct")


def plan(machine: str, **config):
    model = config.pop("model", "Qwen/Qwen3-8B")
    return build_plan(recorded(machine), PlanConfig(model=model, **config), load_shape(model))


def test_one_worker_per_mig_instance_with_its_uuid():
    result = plan("a100_mig")
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in result.workers] == [
        m.uuid for m in recorded("a100_mig").mig_instances]
    assert [w.port for w in result.workers] == [50051, 50052, 50053, 50054]
    assert all(w.mig_profile == "3g.40gb" and w.engine.tensor_parallel_size == 1 for w in result.workers)


def test_tensor_parallel_across_mig_slices_is_refused():
    with pytest.raises(ConfigError, match="no peer access between them.*--tensor-parallel-size 1"):
        plan("h100_mig", tensor_parallel_size=2)


def test_tensor_parallel_groups_whole_gpus():
    result = plan("h100_nomig", tensor_parallel_size=2)
    gpus = recorded("h100_nomig").whole_gpus
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in result.workers] == [
        f"{gpus[0].uuid},{gpus[1].uuid}", f"{gpus[2].uuid},{gpus[3].uuid}"]
    assert [w.device for w in result.workers] == ["GPU 0,1", "GPU 2,3"]
    assert "--tensor-parallel-size" in result.workers[0].argv()


def test_gpus_left_over_by_tensor_parallel_are_reported():
    result = plan("h100_nomig", tensor_parallel_size=3)
    assert len(result.workers) == 1
    assert any("GPU 3 left idle" in note for note in result.notes)


def test_mixed_layout_refuses_a_slice_the_model_does_not_fit():
    with pytest.raises(ConfigError, match="does not fit on MIG 1g.18gb.*--skip-unfit"):
        plan("h200_mig", model="Qwen/Qwen3.5-9B")


def test_mixed_layout_with_skip_unfit_uses_whole_gpu_and_big_slices():
    result = plan("h200_mig", model="Qwen/Qwen3.5-9B", skip_unfit=True, max_model_len=32768)
    assert [w.device for w in result.workers] == ["GPU 1", "MIG 3g.71gb #0 on GPU 0", "MIG 2g.35gb #1 on GPU 0"]
    assert sum("skipped" in note for note in result.notes) == 2
    assert all(w.capacity.fits and w.capacity.kv_tokens > 32768 for w in result.workers)
    assert result.workers[1].capacity_summary()["max_model_len"] == 32768


def test_device_selection_by_gpu_index():
    result = plan("h200_mig", devices="1")
    assert [w.device for w in result.workers] == ["GPU 1"]
    with pytest.raises(ConfigError, match="does not have"):
        plan("h200_mig", devices="7")


def cpu_machine(cores: int, memory_gib: int) -> Inventory:
    cpu = Device(kind="cpu", name="x86_64 CPU", memory_bytes=memory_gib * GiB, cores=tuple(range(cores)))
    return Inventory(source="cpu", cpu=cpu)


def test_cpu_workers_get_disjoint_cores_and_kv_space():
    result = build_plan(cpu_machine(2, 24), PlanConfig(max_model_len=2048), SMOLLM2)
    assert [w.engine.cpu_cores for w in result.workers] == ["0", "1"]
    assert all(w.engine.kv_cache_space_gb == 1 for w in result.workers)
    argv = result.workers[1].argv()
    assert argv[argv.index("--cpu-cores") + 1] == "1"
    assert argv[argv.index("--kv-cache-space-gb") + 1] == "1"


def test_cpu_worker_count_limited_by_memory():
    # 8 cores but 6 GiB: each worker needs weights + 1 GiB KV + 2 GiB runtime → one worker
    result = build_plan(cpu_machine(8, 6), PlanConfig(max_model_len=2048, cores_per_worker=2), SMOLLM2)
    assert [w.engine.cpu_cores for w in result.workers] == ["0-1"]


def test_too_many_cpu_workers_is_refused():
    with pytest.raises(ConfigError, match="must not share cores"):
        build_plan(cpu_machine(2, 24), PlanConfig(cpu_workers=3), SMOLLM2)


def test_mock_plan_needs_no_model():
    result = build_plan(cpu_machine(2, 24), PlanConfig(engine="mock", cpu_workers=1))
    argv = result.workers[0].argv()
    assert argv[argv.index("--engine") + 1] == "mock"
    assert result.workers[0].capacity is None


def as_read_by_the_worker(argv: list[str]) -> tuple[WorkerConfig, EngineConfig]:
    """The configs `vllm-fleet worker` runs with, given this command line."""
    assert argv[1:4] == ["-m", "vllm_fleet.cli", "worker"]
    args = build_parser().parse_args(argv[3:])
    return from_args(WorkerConfig, args), from_args(EngineConfig, args)


def test_a_planned_worker_runs_with_the_settings_planned():
    spec = plan("h100_nomig", tensor_parallel_size=2, enforce_eager=True, max_model_len=8192,
                engine_arg=["swap_space=0"]).workers[1]
    worker, engine = as_read_by_the_worker(spec.argv())
    assert (worker.host, worker.port, worker.device, worker.worker_id) == (
        spec.host, spec.port, spec.device, spec.worker_id)
    assert engine.model_dump() == spec.engine.model_dump()


def test_a_planned_worker_and_one_started_by_hand_are_the_same_worker(tmp_path):
    spec = build_plan(cpu_machine(2, 24), PlanConfig(engine="mock", cpu_workers=2)).workers[1]
    by_hand = WorkerProcess(["--engine", "mock", "--device", spec.device, "--worker-id", spec.worker_id],
                            host=spec.host, port=spec.port, cores=spec.engine.cpu_cores, log_path=tmp_path / "w.log")
    planned = as_read_by_the_worker(spec.argv())
    assert planned[1].cpu_cores == "1"
    assert [c.model_dump() for c in as_read_by_the_worker(by_hand.command)] == [c.model_dump() for c in planned]
