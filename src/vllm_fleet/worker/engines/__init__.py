"""The engines a worker runs behind one `Engine` interface: vLLM's AsyncLLM, and the named mock.

`base.py` is the interface; `vllm_engine.py` the real engine (with `vllm_args.py`,
`vllm_stats.py`, `vllm_outputs.py`, `vllm_kv_events.py`); `mock_*.py` the stand-in for
control-plane tests and benchmarks (never a default); `dtype_choice.py` which weights dtype a
CPU worker loads.
"""

from vllm_fleet.worker.engines.base import Engine, RenderedPrompt, SampleDelta, build_engine

__all__ = ["Engine", "RenderedPrompt", "SampleDelta", "build_engine"]
