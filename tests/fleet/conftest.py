"""Fleet tests that register workers use a real ZooKeeper server (one per session)."""

import pytest

from zookeeper_server import zookeeper_server


@pytest.fixture(autouse=True)
def no_hugging_face_hub(tmp_path_factory, monkeypatch):
    """Model lookups see an empty Hugging Face cache and never the hub: results do not depend on
    what this machine has downloaded, and no test touches the network."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("empty-hf-cache")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def zookeeper():
    yield from zookeeper_server()
