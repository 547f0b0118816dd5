"""`vllm-fleet gateway --processes 2`: two gateway processes on one port, one parent.

Which process answered a connection is read from the kernel (Linux): the server side of the
client's TCP connection is a socket inode in /proc/net/tcp*, held open by exactly one child.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from support import wait_until, worker_env
from vllm_fleet.processes import GatewayProcess

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")]
MODEL = "mock-procs"
DONE_LAST_CHUNK = b"data: [DONE]\n\n\r\n0\r\n\r\n"  # [DONE], then the end of the chunked body


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def serving_pid(client_port: int, server_port: int, pids: list[int]) -> int | None:
    """The pid holding the server side of the connection from `client_port` to `server_port`."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
            if local == server_port and remote == client_port:
                inode = fields[9]
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return pid
    return None


async def stream_on_new_connection(port: int, pids: list[int], max_tokens: int) -> tuple[int | None, asyncio.Task]:
    """Open a keep-alive connection, start a streamed completion on it; (the child serving it,
    the task reading the answer to its end). Kept alive, the connection is still there to look up
    however fast the answer is."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client_port = writer.get_extra_info("sockname")[1]
    body = (b'{"model":"%s","prompt":"once upon","max_tokens":%d,"stream":true}' % (MODEL.encode(), max_tokens))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    pid = serving_pid(client_port, port, pids)

    async def rest() -> bytes:
        try:
            return head + await reader.readuntil(DONE_LAST_CHUNK)
        finally:
            writer.close()

    return pid, asyncio.ensure_future(rest())


async def each_child_answers(port: int, pids: list[int], max_tokens: int, *, timeout: float = 60) -> set[int]:
    """New connections until every child has served one (whole answers), or `timeout`: a child
    counted by the parent may still be starting its listener, and until it listens the kernel
    sends every connection to the others."""
    seen: set[int] = set()

    async def one_more() -> bool:
        pid, reading = await stream_on_new_connection(port, pids, max_tokens)
        answer = await reading
        assert answer.endswith(DONE_LAST_CHUNK), answer[-200:]
        seen.add(pid)
        return seen >= set(pids)

    await wait_until(one_more, timeout=timeout, interval=0.01, message=f"both of {pids} serving a connection")
    return seen


@pytest.fixture(scope="module")
async def fast_worker(module_mock_workers):
    """The mock worker behind this module's gateways, but the one that needs slow streams (a
    worker start is ~9 s of vLLM imports; these tests count the gateway's own numbers)."""
    return await module_mock_workers.start(served_model_name=MODEL, mock_tokens_per_s=2000, mock_ttft_ms=1)


@contextlib.asynccontextmanager
async def two_process_gateway(worker, *extra: str):
    """A `--processes 2` gateway in front of `worker`, both children up: (gateway, their pids)."""
    async with GatewayProcess(["--workers", worker.address, "--processes", "2", *extra], worker_env()) as gateway:
        await gateway.wait_ready(timeout=60)
        await wait_until(lambda: len(children(gateway.pid)) == 2, timeout=30, message="two gateway processes")
        yield gateway, children(gateway.pid)


async def test_two_processes_share_one_port_and_both_answer(fast_worker):
    async with two_process_gateway(fast_worker) as (gateway, pids):
        # The kernel picks a child per connection by its address hash.
        assert await each_child_answers(gateway.port, pids, 4) >= set(pids)


async def test_sigterm_drains_the_streams_of_both_processes(mock_worker_factory):
    # 40 tokens at 20/s: each stream runs ~2 s, so SIGTERM arrives while both are mid-stream.
    worker = await mock_worker_factory.start(served_model_name=MODEL, mock_tokens_per_s=20, mock_ttft_ms=1)
    async with two_process_gateway(worker) as (gateway, pids):
        await each_child_answers(gateway.port, pids, 1)  # both children listen
        streams: dict[int, asyncio.Task] = {}

        async def one_more() -> bool:
            pid, reading = await stream_on_new_connection(gateway.port, pids, 40)
            if pid in streams or pid is None:
                reading.cancel()
            else:
                streams[pid] = reading
            return set(streams) >= set(pids)

        await wait_until(one_more, timeout=30, interval=0.01, message="a stream running on each child")
        gateway.signal(signal.SIGTERM)
        answers = await asyncio.wait_for(asyncio.gather(*streams.values()), 60)
        for answer in answers:  # whole answers: the last token, the finish reason, then [DONE]
            assert b'"finish_reason":"length"' in answer and answer.endswith(DONE_LAST_CHUNK), answer[-300:]
        assert await asyncio.wait_for(gateway.wait_exit(), 60) == 0
        assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # the parent reaped both
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{gateway.url}/health", timeout=5)


async def test_a_child_that_dies_is_started_again_and_the_port_keeps_serving(fast_worker):
    async with two_process_gateway(fast_worker) as (gateway, first):
        # Both listen first: a child killed while still starting is a failed start, which stops
        # the gateway instead (the parent's rule); this test is about one that was serving.
        await each_child_answers(gateway.port, first, 1)
        os.kill(first[0], signal.SIGKILL)
        await wait_until(lambda: len(set(children(gateway.pid)) - set(first)) == 1
                         and len(children(gateway.pid)) == 2, timeout=30, message="the killed child replaced")
        await gateway.wait_ready(timeout=30)
        pids = children(gateway.pid)
        assert await each_child_answers(gateway.port, pids, 4) >= set(pids)
        assert gateway.running


def test_a_child_that_cannot_start_stops_the_gateway(tmp_path):
    keys = tmp_path / "keys.jsonl"
    keys.write_text("this is not a keys file\n")
    done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "gateway", "--workers", "127.0.0.1:1",
                           "--port", "0", "--processes", "2", "--api-key-file", str(keys)],
                          env=worker_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert str(keys) in done.stdout + done.stderr


def counter(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


async def test_metrics_and_the_dashboard_answer_for_every_process(fast_worker):
    async with two_process_gateway(fast_worker) as (gateway, pids):
        served: dict[int, int] = {}

        async def one_more() -> bool:  # new connections until each child has served at least two
            pid, reading = await stream_on_new_connection(gateway.port, pids, 3)
            assert (await reading).endswith(DONE_LAST_CHUNK)
            served[pid] = served.get(pid, 0) + 1
            return len(served) == 2 and min(served.values()) >= 2

        await wait_until(one_more, timeout=60, interval=0.01, message=f"each of {pids} serving two streams")
        total = sum(served.values())
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            for _ in range(4):  # new connections: scrapes land on either child, and each answers for both
                text = (await http.get("/metrics", headers={"connection": "close"})).text
                assert counter(text, "vllm_fleet_gateway_requests_total", endpoint="/v1/completions",
                               status="200") == total, text
                assert counter(text, "vllm_fleet_gateway_tokens_total", direction="completion") == 3 * total
                assert counter(text, "vllm_fleet_gateway_processes_answered") == 2
                state = (await http.get("/dashboard/state.json", headers={"connection": "close"})).json()
                assert state["requests"]["requests"] == total and state["requests"]["completion_tokens"] == 3 * total
                assert state["processes"] == {"serving": 2, "answered": 2}


async def status_on_new_connection(port: int, pids: list[int], key: str) -> tuple[int | None, bytes]:
    """A whole completion on a connection of its own: (the child that served it, the answer's head
    and body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        client_port = writer.get_extra_info("sockname")[1]
        body = b'{"model":"%s","prompt":"once upon","max_tokens":2}' % MODEL.encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s" % (key.encode(), len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        pid = serving_pid(client_port, port, pids)  # the connection is still open: look it up now
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        return pid, head + await reader.readexactly(length)
    finally:
        writer.close()


async def test_a_key_limit_holds_for_all_processes_together(fast_worker, keys_file):
    path, keys = keys_file  # 'abusive' may start 5 requests a minute
    async with two_process_gateway(fast_worker, "--api-key-file", str(path)) as (gateway, pids):
        asked: dict[int, int] = {}
        answers: list[bytes] = []

        async def one_more() -> bool:  # until each child was asked 5 times: each alone would admit 5
            pid, answer = await status_on_new_connection(gateway.port, pids, keys["abusive"])
            asked[pid] = asked.get(pid, 0) + 1
            answers.append(answer)
            return len(asked) == 2 and min(asked.values()) >= 5

        began = time.monotonic()
        await wait_until(one_more, timeout=60, interval=0.01, message=f"each of {pids} asked five times")
        refill = int((time.monotonic() - began) * 5 / 60)  # what the bucket earned meanwhile (0 in a few s)
        admitted = [a for a in answers if a.startswith(b"HTTP/1.1 200")]
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 429")]
        # Each process alone would admit 5, so 10 in all; shared, the gateway admits 5.
        assert 5 <= len(admitted) <= 5 + refill, [a[:40] for a in answers]
        assert len(refused) == len(answers) - len(admitted), [a[:40] for a in answers]
        assert all(b"requests per minute" in a and b"retry-after" in a.lower() for a in refused), refused[0]
