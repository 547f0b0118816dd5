"""An idempotent sink for Structured Streaming's foreachBatch.

Spark replays a micro-batch after a restart when its output was not committed to the
checkpoint. `foreach_batch_writer(path)` writes micro-batch N to `path/batch_id=N` with mode
overwrite, so a replayed batch replaces its own earlier (possibly partial) files instead of
adding a second copy: each input row appears once in the output, whatever the restarts.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame


def foreach_batch_writer(path: str, *, format: str = "parquet") -> Callable[[DataFrame, int], None]:
    """A `foreachBatch` function that writes each micro-batch to `path/batch_id=<id>`, replacing it."""
    def write(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("overwrite").format(format).save(f"{path.rstrip('/')}/batch_id={batch_id}")

    return write
