"""Fleet files: several models on one node, read, placed and checked before anything starts."""

from __future__ import annotations

import json

import pytest

from test_gpus import recorded
from vllm_fleet.errors import ConfigError
from vllm_fleet.fleet.fleet_file import FleetFile, load_fleet_file, parse_devices
from vllm_fleet.fleet.fleet_plan import build_fleet_plan
from vllm_fleet.fleet.gpus import Device, Inventory

GiB = 1024**3

TWO_MODELS_YAML = """
engine: mock
base_port: 7000
models:
  - model: alpha-model
    served_model_name: alpha
    replicas: 2
    devices: cpu:0-1
    pool: short
  - model: beta-model
    devices: cpu:2-3
    pool: long
"""


def cpu_node(cores: int = 4, memory_gib: int = 64) -> Inventory:
    return Inventory(source="test", cpu=Device(kind="cpu", name="cpu", memory_bytes=memory_gib * GiB,
                                               cores=tuple(range(cores))))


def fleet(*models: dict, engine: str = "vllm") -> FleetFile:
    return FleetFile(engine=engine, models=list(models))


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_yaml_and_json_fleet_files_read_the_same(tmp_path):
    yaml_file = tmp_path / "fleet.yaml"
    yaml_file.write_text(TWO_MODELS_YAML)
    from_yaml = load_fleet_file(yaml_file)
    json_file = tmp_path / "fleet.json"
    json_file.write_text(json.dumps(from_yaml.model_dump()))
    assert load_fleet_file(json_file) == from_yaml
    assert [(m.name, m.replicas, m.pool) for m in from_yaml.models] == [("alpha", 2, "short"), ("beta-model", 1, "long")]


def test_unknown_keys_and_bad_devices_are_named_with_their_place_in_the_file(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("models:\n  - model: m\n    devices: gpu:0\n    replica: 2\n  - model: n\n    devices: tpu:0\n")
    with pytest.raises(ConfigError) as refused:
        load_fleet_file(path)
    message = str(refused.value)
    assert "models[0].replica: Extra inputs are not permitted" in message
    assert "models[1].devices" in message and "'tpu:0' is not a device list" in message


@pytest.mark.parametrize("text, kind, indices, share", [
    ("gpu:0-3", "gpu", (0, 1, 2, 3), 0.0), ("gpu:0,2", "gpu", (0, 2), 0.0), ("cpu:0-1,4", "cpu", (0, 1, 4), 0.0),
    ("0.5", "share", (), 0.5), ("gpu:1@0.4", "share", (1,), 0.4),
])
def test_device_forms(text, kind, indices, share):
    request = parse_devices(text)
    assert (request.kind, request.indices, request.share) == (kind, indices, share)


def test_two_mock_models_on_cpu_cores_get_their_cores_pools_and_ports(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(TWO_MODELS_YAML)
    plan = build_fleet_plan(cpu_node(), load_fleet_file(path))
    assert [(w.device, w.pool, w.port) for w in plan.workers] == [
        ("cpu 0", "short", 7000), ("cpu 1", "short", 7001), ("cpu 2-3", "long", 7002)]
    argv = plan.workers[0].argv()
    assert option(argv, "--pool") == "short" and option(argv, "--served-model-name") == "alpha"
    assert option(argv, "--cpu-cores") == "0"
    assert len({w.worker_id for w in plan.workers}) == 3
    assert not plan.notes


def test_a_pool_no_workload_class_maps_to_is_pointed_out():
    plan = build_fleet_plan(cpu_node(), fleet({"model": "m", "devices": "cpu:0", "pool": "batch"}, engine="mock"))
    assert plan.notes == ["pool 'batch' is not a workload class (short, long): routers with --class-pools send it "
                          "nothing"]


def test_mig_instances_and_gpu_shares_side_by_side():
    plan = build_fleet_plan(recorded("h200_mig"), fleet(
        {"model": "Qwen/Qwen3-8B", "devices": "mig:3g.71gb", "pool": "long", "max_model_len": 8192},
        {"model": "Qwen/Qwen3-8B", "served_model_name": "small", "replicas": 2, "devices": "gpu:1@0.45",
         "pool": "short", "max_model_len": 8192},
    ))
    mig, share_a, share_b = plan.workers
    assert mig.mig_profile == "3g.71gb" and mig.pool == "long"
    assert share_a.env == share_b.env == {"CUDA_VISIBLE_DEVICES": recorded("h200_mig").whole_gpus[0].uuid}
    assert option(share_a.argv(), "--gpu-memory-utilization") == "0.45"
    assert all(w.capacity.fits and w.capacity.kv_tokens > 8192 for w in plan.workers)


def test_whole_gpus_split_over_replicas_as_tensor_parallel_groups():
    plan = build_fleet_plan(recorded("h100_nomig"), fleet({"model": "Qwen/Qwen3-8B", "replicas": 2,
                                                           "devices": "gpu:0-3"}))
    assert [w.device for w in plan.workers] == ["GPU 0,1", "GPU 2,3"]
    assert all(w.engine.tensor_parallel_size == 2 for w in plan.workers)


def test_a_fleet_that_does_not_fit_is_refused_with_every_problem_listed():
    with pytest.raises(ConfigError) as refused:
        build_fleet_plan(recorded("h200_mig"), fleet(
            {"model": "nobody/no-such-model", "devices": "gpu:1"},                      # unknown model
            {"model": "Qwen/Qwen3-8B", "devices": "gpu:1@0.5"},                       # GPU 1 again
            {"model": "Qwen/Qwen3-8B", "replicas": 3, "devices": "mig:2g.35gb"},      # 1 such instance
            {"model": "Qwen/Qwen3.5-9B", "devices": "mig:1g.18gb"},                   # weights do not fit
            {"model": "Qwen/Qwen3-8B", "devices": "gpu:7"},                           # no such GPU
        ))
    message = str(refused.value)
    assert "nothing was started" in message
    assert "models[0] (nobody/no-such-model): no config.json for model 'nobody/no-such-model'" in message
    assert "models[1] (Qwen/Qwen3-8B): no GPU has 0.5 left" in message
    assert "models[2] (Qwen/Qwen3-8B): 3 replicas but 1 free MIG instances of 2g.35gb" in message
    assert "models[3] (Qwen/Qwen3.5-9B) on MIG 1g.18gb #2 on GPU 0:" in message and "exceed" in message
    assert "models[4] (Qwen/Qwen3-8B): this node has no GPU 7" in message


def test_overlapping_whole_gpus_name_the_entry_that_holds_them():
    with pytest.raises(ConfigError, match=r"models\[1\] \(b\): GPU 1 is also given to models\[0\] \(a\)"):
        build_fleet_plan(recorded("h100_nomig"), fleet(
            {"model": "Qwen/Qwen3-8B", "served_model_name": "a", "devices": "gpu:0-1"},
            {"model": "Qwen/Qwen3-8B", "served_model_name": "b", "devices": "gpu:1-2"},
        ))


def test_shares_of_one_gpu_may_not_add_up_past_the_limit():
    with pytest.raises(ConfigError, match="no GPU has 0.5 left for replica 2 of 2"):
        build_fleet_plan(recorded("h200_nomig"), fleet({"model": "Qwen/Qwen3-8B", "replicas": 2,
                                                        "devices": "gpu:0@0.5", "max_model_len": 8192}))
    plan = build_fleet_plan(recorded("h200_nomig"), fleet({"model": "Qwen/Qwen3-8B", "replicas": 3,
                                                           "devices": "0.45", "max_model_len": 8192}))
    assert [w.device for w in plan.workers] == ["GPU 0 (0.45)", "GPU 0 (0.45)", "GPU 1 (0.45)"]


def test_cpu_problems_more_replicas_than_cores_shared_cores_and_memory():
    with pytest.raises(ConfigError) as refused:
        build_fleet_plan(cpu_node(cores=4, memory_gib=32), fleet(
            {"model": "Qwen/Qwen3-8B", "replicas": 3, "devices": "cpu:0-1"},
            {"model": "Qwen/Qwen3-8B", "served_model_name": "b", "devices": "cpu:1-2"},
            {"model": "Qwen/Qwen3-8B", "served_model_name": "c", "devices": "cpu:3", "kv_cache_space_gb": 64},
        ))
    message = str(refused.value)
    assert "3 replicas but 2 cores: more replicas than devices" in message
    assert "models[1] (b): cores 1 are also given to models[0]" in message
    assert "models[2] (c) on cpu 3: weights" in message and "lower --kv-cache-space-gb" in message


def test_lora_slots_tool_parser_and_load_format_reach_each_workers_command_line():
    # Without these keys a fleet file could not start a LoRA-serving or tool-calling model:
    # they are worker options, not engine arguments, so `engine_arg` cannot carry them.
    plan = build_fleet_plan(recorded("h200_mig"), fleet(
        {"model": "Qwen/Qwen3-8B", "replicas": 2, "devices": "gpu:1@0.45", "max_model_len": 8192,
         "max_loras": 2, "max_lora_rank": 8, "tool_call_parser": "hermes", "enable_auto_tool_choice": True,
         "load_format": "dummy"},
        {"model": "Qwen/Qwen3-8B", "served_model_name": "plain", "devices": "mig:3g.71gb", "max_model_len": 8192},
    ))
    tuned_a, tuned_b, plain = plan.workers
    for worker in (tuned_a, tuned_b):
        argv = worker.argv()
        assert option(argv, "--max-loras") == "2" and option(argv, "--max-lora-rank") == "8"
        assert option(argv, "--tool-call-parser") == "hermes" and "--enable-auto-tool-choice" in argv
        assert option(argv, "--load-format") == "dummy"
    assert not {"--max-loras", "--tool-call-parser", "--load-format"} & set(plain.argv())


def test_a_lora_rank_vllm_does_not_take_is_refused_with_its_place(tmp_path):
    path = tmp_path / "fleet.json"
    path.write_text('{"models": [{"model": "m", "devices": "cpu:0", "max_loras": 1, "max_lora_rank": 12}]}')
    with pytest.raises(ConfigError, match=r"models\[0\]\.max_lora_rank.*must be one of"):
        load_fleet_file(path)
