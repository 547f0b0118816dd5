"""Registry tests run against a real ZooKeeper server (one per session)."""

import pytest

from zookeeper_server import zookeeper_server


@pytest.fixture(scope="session")
def zookeeper():
    yield from zookeeper_server()
