"""Two mock workers for the Spark tests (the local SparkSession fixture, `spark`, is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
async def mock_pair(mock_worker_factory):
    """Two mock workers, fast enough that a 1,000-row job takes seconds."""
    first = await mock_worker_factory.start(mock_tokens_per_s=2000, mock_ttft_ms=2)
    second = await mock_worker_factory.start(mock_tokens_per_s=2000, mock_ttft_ms=2)
    return [first, second]
