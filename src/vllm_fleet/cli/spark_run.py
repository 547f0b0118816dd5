"""`vllm-fleet spark-run`: answer a file of prompts with Spark and write the answers.

    vllm-fleet spark-run --input prompts.jsonl --output out.parquet --workers 127.0.0.1:50051 --max-tokens 64

Shows progress while the job runs (rows done of the input's, rows/s, output tokens/s, an ETA,
reported live by the executors: spark/progress.py; and Spark's tasks; and, while rows wait for
batch capacity, "waiting for batch capacity: <reason>"), then a summary: rows,
errors, output tokens and tokens/s. Exit status 0 when every row was answered, 1 when some
rows carry an error (the output is written either way), 2 for configuration errors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from vllm_fleet.config import add_options
from vllm_fleet.errors import ConfigError
from vllm_fleet.spark.config import SparkGenerateConfig, build_config
from vllm_fleet.spark.progress import ProgressListener, progress_line

READERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
PROGRESS_INTERVAL_S = 0.5
FULL_LINE_EVERY_S = 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("spark-run", help="Answer a file of prompts through Spark (batch inference)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    io = parser.add_argument_group("input and output")
    io.add_argument("--input", required=True, help="Prompts: .jsonl, .parquet or .csv (with a header)")
    io.add_argument("--output", required=True, help="Where to write the answers (parquet folder)")
    io.add_argument("--overwrite", action="store_true", help="Replace --output if it exists")
    spark = parser.add_argument_group("spark")
    spark.add_argument("--master", default=None, help="Spark master: local[*], spark://host:7077, ... (default: spark-submit's)")
    spark.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Extra Spark setting; repeatable")
    job = parser.add_argument_group("job")
    job.add_argument("--workers", default=None, help="Worker addresses host:port,host:port")
    job.add_argument("--max-tokens", type=int, default=None, help="Output tokens per row")
    job.add_argument("--temperature", type=float, default=None, help="Sampling temperature (0: greedy)")
    job.add_argument("--param", action="append", default=[], metavar="KEY=JSON",
                     help='Any other sampling parameter, e.g. --param top_p=0.9 --param stop=\'["\\n"]\'')
    job.add_argument("--router", default=None, metavar="JSON", help='RouterConfig fields, e.g. \'{"max_attempts": 3}\'')
    add_options(job, SparkGenerateConfig, skip=("workers", "params", "router", "progress_address"))
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = build(args)
    reader = READERS.get(Path(args.input).suffix.lower())
    if reader is None:
        raise ConfigError(f"--input {args.input}: use a .jsonl, .parquet or .csv file")
    if not Path(args.input).exists():
        raise ConfigError(f"--input {args.input}: no such file")
    session = spark_session(args)
    try:
        from vllm_fleet.spark.driver import plan

        frame = session.read.format(reader)
        if reader == "csv":
            frame = frame.option("header", "true")
        prompts = frame.load(args.input)
        total_rows = prompts.count()  # for the ETA: one cheap pass over the input
        # Executors reach the driver at spark.driver.host (Spark's own traffic does).
        listener = ProgressListener(session.sparkContext.getConf().get("spark.driver.host", "127.0.0.1"))
        try:
            answered = plan(prompts, config.model_copy(update={"progress_address": listener.address}))
            started = time.monotonic()
            with Progress(session.sparkContext, listener, total_rows):
                answered.write.mode("overwrite" if args.overwrite else "errorifexists").parquet(args.output)
        finally:
            listener.close()
        return summarize(session, args.output, time.monotonic() - started)
    finally:
        session.stop()


def build(args: argparse.Namespace) -> SparkGenerateConfig:
    params = {}
    if args.max_tokens is not None:
        params["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        params["temperature"] = args.temperature
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--param {item}: expected KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    try:
        router = json.loads(args.router) if args.router else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--router: not valid JSON ({exc.msg})") from None
    # Only the options given on the command line; the config's defaults fill in the rest.
    values = {name: getattr(args, name) for name in SparkGenerateConfig.model_fields
              if hasattr(args, name) and name not in ("workers", "params", "router")}
    if "prompt_col" not in values and "messages_col" not in values:
        values["prompt_col"] = "prompt"
    return build_config(**values, workers=args.workers, params=params, router=router)


def spark_session(args: argparse.Namespace):
    # Executors must run this interpreter (it has vllm_fleet and pyarrow) unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("vllm-fleet spark-run").config("spark.speculation", "false")
    if args.master:
        builder = builder.master(args.master)
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--conf {item}: expected KEY=VALUE")
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


class Progress:
    """One line, rewritten every half second: rows, rows/s, tokens/s and ETA from the executors'
    reports, then the running stages' tasks from Spark's status tracker."""

    def __init__(self, context, listener: ProgressListener, total_rows: int, stream=sys.stderr) -> None:
        self.tracker = context.statusTracker()
        self.listener = listener
        self.total_rows = total_rows
        self.stream = stream
        self._started = time.monotonic()
        self._full_at = float("-inf")  # when a line too long for the terminal was last shown whole
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._show()  # the last tasks' final reports
        self.stream.write("\n")

    def _loop(self) -> None:
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            self._show()

    def _show(self) -> None:
        done = total = 0
        for stage_id in self.tracker.getActiveStageIds():
            info = self.tracker.getStageInfo(stage_id)
            if info is not None:
                done, total = done + info.numCompletedTasks, total + info.numTasks
        line = progress_line(self.listener.totals(), self.total_rows, time.monotonic() - self._started,
                             self.listener.waiting())
        if total:
            line += f"  [{done}/{total} tasks]"
        width = shutil.get_terminal_size().columns if self.stream.isatty() else 0
        if width and len(line) >= width:
            # A wrapped line would not be rewritten in place (\r goes back one row only): show it
            # whole once in a while above the progress line, and the progress line cut to fit.
            now = time.monotonic()
            if now - self._full_at >= FULL_LINE_EVERY_S:
                self._full_at = now
                self.stream.write(f"\r{line}\x1b[K\n")
            line = line[:width - 2] + "…"
        self.stream.write(f"\r{line}\x1b[K")  # \x1b[K: clear what a longer line left
        self.stream.flush()


def summarize(session, output: str, elapsed_s: float) -> int:
    from pyspark.sql import functions as F

    totals = session.read.parquet(output).agg(
        F.count(F.lit(1)).alias("rows"),
        F.count("error").alias("errors"),
        F.coalesce(F.sum("completion_tokens"), F.lit(0)).alias("tokens"),
    ).first()
    rate = totals.tokens / elapsed_s if elapsed_s > 0 else 0.0
    print(f"rows: {totals.rows}  errors: {totals.errors}  output tokens: {totals.tokens}  "
          f"time: {elapsed_s:.1f}s  rows/s: {totals.rows / max(elapsed_s, 1e-9):.1f}  tokens/s: {rate:.1f}")
    if totals.errors:
        sample = session.read.parquet(output).where("error IS NOT NULL").select("error").limit(3).collect()
        for row in sample:
            print(f"  error: {row.error}")
    return 1 if totals.errors else 0
