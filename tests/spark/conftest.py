"""Two mock workers for the Spark tests (the local SparkSession fixture, `spark`, is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
async def mock_pair(session_mock_workers):
    """Two mock workers, fast enough that a 1,000-row job takes seconds."""
    first = await session_mock_workers.start(mock_tokens_per_s=2000, mock_ttft_ms=2)
    second = await session_mock_workers.start(mock_tokens_per_s=2000, mock_ttft_ms=2)
    return [first, second]
