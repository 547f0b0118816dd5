"""A crash-safe, idempotent sink for Structured Streaming's foreachBatch.

Spark replays a micro-batch after a restart when its output was not committed to the
checkpoint. `foreach_batch_writer(path)` makes micro-batch N appear at `path/batch_id=N` whole
or not at all:

* the batch is written to `path/_staging/batch_id=N` first, then renamed to `path/batch_id=N`
  (one rename: atomic on HDFS and POSIX filesystems, so not on S3-like object stores);
* readers that go through Spark (`spark.read.parquet(path)`) skip `_`-prefixed names, so they
  never see a staged batch, whatever state a killed driver left it in;
* a replayed batch whose `batch_id=N` is already there was committed by the sink before the
  crash and not yet by the checkpoint: Spark replays it with the same input, so it is skipped
  (no second copy and no second inference); what a dead attempt left in `_staging` is removed.

Writing in place with mode overwrite (as this sink did before) is not enough: with Hadoop's
committer algorithm 2 (set on many clusters for speed) each task's files land in `batch_id=N`
as the task commits, so a driver killed mid-batch left half a batch that readers saw until the
replay replaced it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)
STAGING = "_staging"


def foreach_batch_writer(path: str, *, format: str = "parquet") -> Callable[[DataFrame, int], None]:
    """A `foreachBatch` function that commits each micro-batch to `path/batch_id=<id>` atomically."""
    root = path.rstrip("/")

    def write(batch: DataFrame, batch_id: int) -> None:
        files = _Files(batch.sparkSession, root)
        final = f"{root}/batch_id={batch_id}"
        if files.exists(final):
            logger.info("sink %s: batch %d is already committed; a replay after a restart, skipped", root, batch_id)
            return
        files.delete(f"{root}/{STAGING}")  # a dead attempt's partial files: one query writes this sink
        staged = f"{root}/{STAGING}/batch_id={batch_id}"
        try:
            batch.write.format(format).save(staged)
            files.rename(staged, final)
        finally:
            files.delete(f"{root}/{STAGING}")

    return write


class _Files:
    """The Hadoop FileSystem of `root` (local, HDFS, ...), through the driver's JVM."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm = spark.sparkContext._jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._path(root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def delete(self, path: str) -> None:
        self._fs.delete(self._path(path), True)

    def rename(self, source: str, target: str) -> None:
        if not self._fs.rename(self._path(source), self._path(target)):
            raise OSError(f"could not rename {source} to {target}; the batch stays uncommitted and will be replayed")
