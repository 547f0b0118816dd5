"""A Structured Streaming driver in its own process, for the crash test: JSON files in a folder
→ generate(ledger_path=...) → foreach_batch_writer, checkpointed. It runs until the folder is
drained (trigger availableNow, one file per micro-batch) and exits 0.

    python tests/spark/stream_driver.py --source IN --sink OUT --checkpoint CP --ledger L \
        --workers host:port,host:port
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("source", "sink", "checkpoint", "ledger", "workers"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-in-flight", type=int, default=4)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from pyspark.sql import SparkSession

    from vllm_fleet.spark import foreach_batch_writer, generate

    spark = (SparkSession.builder.master("local[2]").appName("vllm-fleet-stream-driver")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    stream = (spark.readStream.schema("id long, prompt string").option("maxFilesPerTrigger", 1).json(args.source)
              .repartition(2))
    answered = generate(stream, prompt_col="prompt", id_col="id", params={"max_tokens": args.max_tokens},
                        workers=args.workers.split(","), ledger_path=args.ledger, max_in_flight=args.max_in_flight,
                        batch_size=4)
    query = (answered.writeStream.option("checkpointLocation", args.checkpoint).trigger(availableNow=True)
             .foreachBatch(foreach_batch_writer(args.sink)).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
