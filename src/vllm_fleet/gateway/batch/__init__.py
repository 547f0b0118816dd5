"""OpenAI's Batch API on the gateway: /v1/files and /v1/batches, run as the batch class on the same workers.

    api.py        the routes (BatchApi), and the store's and runner's lifecycle
    store.py      SQLite state (files, batches, each line's state and result, leases) + files on disk
    lines.py      input lines checked one by one; output and error lines in OpenAI's shape
    runner.py     BatchRunner: claims batches by lease, runs lines through the gateway's own handling
    progress.py   Prometheus series and progress log lines
    multipart.py  multipart/form-data for uploads
"""

from vllm_fleet.gateway.batch.api import BatchApi
from vllm_fleet.gateway.batch.runner import BatchRunner

__all__ = ["BatchApi", "BatchRunner"]
