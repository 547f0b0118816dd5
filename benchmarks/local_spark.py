"""A local Spark session for the pool benchmarks, optionally at a lower CPU priority."""

from __future__ import annotations

import os
import sys


def spark_session(cores: int, niceness: int = 0):
    from pyspark.sql import SparkSession

    # Spark's Python workers run this interpreter (ours has the fleet's dependencies), not python3.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYTHONPATH", os.pathsep.join(sys.path))

    session = (SparkSession.builder.master(f"local[{cores}]").config("spark.driver.memory", "4g")
               .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    if niceness:
        renice_spark(session, niceness)
    return session


def renice_spark(session, niceness: int) -> None:
    """Lower the CPU priority of Spark's JVM, and so of the Python workers it forks later. On a
    deployment its executors run on other hosts than the engines; on one small machine they take
    the engines' cores, which measures CPU contention rather than the pool's classes. Linux keeps
    niceness per thread, and a new thread or process takes its creator's: every thread of the JVM
    is reniced before any task runs."""
    pid = session.sparkContext._gateway.proc.pid
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), niceness)
