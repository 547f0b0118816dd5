"""Two mock workers for the Spark tests (the local SparkSession fixture, `spark`, is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
async def mock_pair(session_mock_workers):
    """Two mock workers, fast enough that a 1,000-row job takes seconds."""
    return await session_mock_workers.start_many(2, mock_tokens_per_s=2000, mock_ttft_ms=2)
