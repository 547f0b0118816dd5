"""The worker's ZMQ subscriber meets vLLM's KV-event publisher whichever side binds.

vLLM 0.32 names its rule (`ZmqEventPublisher._is_bind_endpoint`); vLLM 0.26, the GPU machine's,
applies the same rule inline and has no such attribute. Each test plays the publisher as that
release does and checks that a message sent after the sockets meet reaches the subscriber."""

from __future__ import annotations

import time

import pytest
import zmq

from vllm_fleet.worker.engines import vllm_kv_events
from vllm_fleet.worker.engines.vllm_kv_events import open_subscriber

kv_events = pytest.importorskip("vllm.distributed.kv_events")


def _publisher_as_vllm_does(context: zmq.Context, endpoint: str) -> zmq.Socket:
    # vLLM's publisher (0.26 inline, 0.32 through _is_bind_endpoint): bind wildcard, IPv6-any and
    # ipc/inproc endpoints, connect to every other.
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        pub.bind(endpoint)
    else:
        pub.connect(endpoint)
    return pub


def _first_message(pub: zmq.Socket, sub: zmq.Socket, deadline_s: float = 10.0) -> list[bytes] | None:
    """Publish until the subscriber reads one (PUB drops what it sends before the peers meet)."""
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        pub.send_multipart([b"kv", (1).to_bytes(8, "big"), b"payload"])
        if poller.poll(50):
            return sub.recv_multipart()
    return None


@pytest.mark.parametrize("release", ["0.32 (names its rule)", "0.26 (rule inline)"])
def test_events_flow_from_the_publisher_to_our_subscriber(release, monkeypatch):
    if release.startswith("0.26"):
        monkeypatch.delattr(kv_events.ZmqEventPublisher, "_is_bind_endpoint", raising=False)
    context = zmq.Context()
    sub, endpoint = open_subscriber(context)
    pub = _publisher_as_vllm_does(context, endpoint)
    try:
        assert _first_message(pub, sub) == [b"kv", (1).to_bytes(8, "big"), b"payload"], \
            f"no event crossed from vLLM {release}'s publisher to the worker ({endpoint})"
    finally:
        pub.close()
        sub.close()
        context.term()


def test_without_a_named_rule_the_convention_decides():
    assert vllm_kv_events.binds_by_convention("tcp://*:5557")
    assert vllm_kv_events.binds_by_convention("ipc:///tmp/kv")
    assert not vllm_kv_events.binds_by_convention("tcp://127.0.0.1:5557")


def test_vllm_publishes_kv_events_only_when_the_worker_is_asked():
    # vLLM builds and publishes the events in its engine process, on the step's path: a worker not
    # started with --kv-events (the default) must not ask for them; one started with it must.
    from vllm_fleet.config import EngineConfig
    from vllm_fleet.worker.engines.vllm_engine import VllmEngine

    default = VllmEngine(EngineConfig(engine="vllm"))
    kwargs: dict = {}
    default._ask_for_kv_events(kwargs)
    assert "kv_events_config" not in kwargs

    asked = VllmEngine(EngineConfig(engine="vllm", kv_events=True))
    try:
        asked._ask_for_kv_events(kwargs)
        assert kwargs["kv_events_config"].enable_kv_cache_events
    finally:
        asked._kv_socket.close(linger=0)
