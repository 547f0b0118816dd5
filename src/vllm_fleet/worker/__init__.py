"""The worker: one engine (vLLM or the mock) behind the `vllm_fleet.v1.Worker` gRPC service.

Rooms: `engines/` (the engines), `openai/` (vLLM's meaning for a request body), `resume/`
(continuing a migrated stream), `watch/` (hung-engine detection); the serving loop sits here:
`server.py` (the process), `service.py` (the gRPC service; its Generate RPCs in
`generate_rpcs.py`, its requests in flight in `in_flight.py`), `prepare.py` (one preparation
path for every engine), `request_stream.py`, `coalescer.py`, `mux.py`, `status.py`,
`validation.py`.
"""

from vllm_fleet.worker.engines.base import Engine, build_engine
from vllm_fleet.worker.server import WorkerServer, run_worker

__all__ = ["Engine", "WorkerServer", "build_engine", "run_worker"]
