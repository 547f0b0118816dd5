"""One local SparkSession for the whole test session, and two mock workers for the Spark tests."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    # Executors must run this interpreter (it has pyarrow and vllm_fleet), set before the JVM starts.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("vllm-fleet-tests")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
async def mock_pair(mock_worker_factory):
    """Two mock workers, fast enough that a 1,000-row job takes seconds."""
    first = await mock_worker_factory.start(mock_tokens_per_s=2000, mock_ttft_ms=2)
    second = await mock_worker_factory.start(mock_tokens_per_s=2000, mock_ttft_ms=2)
    return [first, second]
