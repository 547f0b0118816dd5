"""Keys and limits reload without a restart: on a file change (polled) and on SIGHUP.

Gateway processes (the shipped GatewayProcess) in front of mock workers: a rewritten keys
file takes effect (a new key works, a removed one gets 401 from the same reload on), streams
in flight run to their end and keep their admission reservation, and a broken file is refused
with the old keys still in force. Below, the pieces on their own: admission buckets across a
limits change, and the reloader's all-or-nothing rule.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway_support import MODEL_A
from support import wait_until, worker_env
from vllm_fleet.errors import ConfigError, RateLimitedError
from vllm_fleet.gateway.keys import KeyRecord, KeyStore, hash_key, write_keys
from vllm_fleet.gateway.reload import LimitsSource, Reloader
from vllm_fleet.processes import GatewayProcess
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import AdmissionConfig, KeyLimits, Router, RouterConfig
from vllm_fleet.router.quota.admission import Admission
from vllm_fleet.router.features import SHORT

pytestmark = pytest.mark.timeout(120)

OLD, NEW, STAY = (KeyRecord(name, hash_key(f"sk-{name}")) for name in ("old", "new", "stay"))


def bearer(record: KeyRecord) -> dict:
    return {"authorization": f"Bearer sk-{record.id}"}


async def status(url: str, record: KeyRecord) -> int:
    """The status of GET /v1/models with this key (auth only: no worker, no admission)."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        return (await http.get("/v1/models", headers=bearer(record))).status_code


async def chat(url: str, record: KeyRecord, max_tokens: int = 1) -> httpx.Response:
    body = {"model": MODEL_A, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        return await http.post("/v1/chat/completions", json=body, headers=bearer(record))


def gateway(worker, keys: Path, *extra: str) -> GatewayProcess:
    return GatewayProcess(["--workers", worker.address, "--api-key-file", str(keys), *extra], worker_env())


@pytest.fixture
def keys_path(tmp_path) -> Path:
    path = tmp_path / "keys.jsonl"
    write_keys(path, [OLD, STAY])
    return path


async def test_a_rewritten_keys_file_applies_without_a_restart(mock_fleet, keys_path):
    async with gateway(mock_fleet["a"][0], keys_path, "--reload-interval-s", "0.1") as gw:
        await gw.wait_ready(timeout=60)
        assert (await status(gw.url, OLD), await status(gw.url, NEW)) == (200, 401)
        write_keys(keys_path, [STAY, NEW])
        await wait_until(lambda: _status_is(gw.url, NEW, 200), timeout=20, message="the new key to be accepted")
        assert await status(gw.url, OLD) == 401  # removed by the same reload that added NEW
        assert (await chat(gw.url, STAY)).status_code == 200
        # Limits in the keys file reload too: one request per minute for STAY from now on.
        write_keys(keys_path, [NEW, KeyRecord(STAY.id, STAY.sha256, limits={"requests_per_min": 1})])
        await wait_until(lambda: _chat_refused(gw.url, STAY), timeout=20, message="STAY's new limit to apply")
        assert (await chat(gw.url, NEW)).status_code == 200
        assert gw.running


async def test_sighup_reloads_keys_and_a_key_limits_file(mock_fleet, keys_path, tmp_path):
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({"stay": {"requests_per_min": 1000}}))
    async with gateway(mock_fleet["a"][0], keys_path, "--reload-interval-s", "0",
                       "--key-limits", f"@{limits}") as gw:
        await gw.wait_ready(timeout=60)
        write_keys(keys_path, [STAY, NEW])
        limits.write_text(json.dumps({"stay": {"requests_per_min": 1}}))
        assert await status(gw.url, NEW) == 401  # no polling: nothing reloads by itself
        assert (await chat(gw.url, STAY)).status_code == 200
        gw.signal(signal.SIGHUP)
        await wait_until(lambda: _status_is(gw.url, NEW, 200), timeout=20, message="SIGHUP to load the new key")
        assert await status(gw.url, OLD) == 401
        await wait_until(lambda: _chat_refused(gw.url, STAY), timeout=20, message="the limit from the reloaded file")
        assert gw.running


async def test_streams_in_flight_run_to_their_end_across_a_reload(mock_worker_factory, tmp_path):
    stall = tmp_path / "stall"  # while it exists the worker's streams produce nothing: held in flight
    worker = await mock_worker_factory.start(served_model_name=MODEL_A, mock_tokens_per_s=20, mock_ttft_ms=2,
                                             mock_stall_file=str(stall))
    keys = tmp_path / "keys.jsonl"
    budgeted = KeyRecord(STAY.id, STAY.sha256, limits={"tokens_per_min": 100})
    write_keys(keys, [OLD, budgeted])
    async with gateway(worker, keys, "--reload-interval-s", "0") as gw:
        await gw.wait_ready(timeout=60)
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
            firsts = {OLD.id: asyncio.Event(), STAY.id: asyncio.Event()}
            streams = {r.id: asyncio.ensure_future(_stream(http, r, 60, firsts[r.id])) for r in (OLD, budgeted)}
            await wait_until(lambda: all(e.is_set() for e in firsts.values()), timeout=30, message="first tokens")
            stall.touch()
            write_keys(keys, [budgeted, NEW])  # OLD removed while its stream runs; STAY's limits unchanged
            gw.signal(signal.SIGHUP)
            await wait_until(lambda: _status_is(gw.url, NEW, 200), timeout=20, message="the reload")
            assert await status(gw.url, OLD) == 401
            assert not any(s.done() for s in streams.values()), "the streams ended before the reload"
            # STAY's stream still holds its reservation (~60 of 100 tokens): no free refill.
            refused = await chat(gw.url, STAY, max_tokens=60)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "tokens_per_min"
            stall.unlink()
            for key_id, stream in streams.items():
                finish, completion_tokens, done = await stream
                assert (finish, completion_tokens, done) == ("length", 60, True), key_id


async def test_a_broken_keys_file_keeps_the_old_keys(mock_fleet, keys_path):
    async with gateway(mock_fleet["a"][0], keys_path, "--reload-interval-s", "0.1") as gw:
        await gw.wait_ready(timeout=60)
        keys_path.write_text(STAY.to_json() + "\n" + '{"id": "new", "sha256": "sk-plaintext"}\n')
        await wait_until(lambda: "reload refused" in gw.log_tail(), timeout=20, message="the refusal in the log")
        refusal = next(line for line in gw.log_tail().splitlines() if "reload refused" in line)
        assert f"{keys_path}:2:" in refusal and "'sha256'" in refusal
        gw.signal(signal.SIGHUP)  # a SIGHUP with the file still broken changes nothing either
        assert (await status(gw.url, OLD), await status(gw.url, STAY)) == (200, 200)
        assert (await chat(gw.url, OLD)).status_code == 200
        write_keys(keys_path, [STAY, NEW])  # fixed: the next change applies
        await wait_until(lambda: _status_is(gw.url, NEW, 200), timeout=20, message="the fixed file to load")
        assert await status(gw.url, OLD) == 401
        assert gw.running


async def _status_is(url: str, record: KeyRecord, expected: int) -> bool:
    return await status(url, record) == expected


async def _chat_refused(url: str, record: KeyRecord) -> bool:
    reply = await chat(url, record)
    return reply.status_code == 429 and reply.json()["error"]["code"] == "requests_per_min"


async def _stream(http: httpx.AsyncClient, record: KeyRecord, max_tokens: int,
                  first: asyncio.Event) -> tuple[str | None, int | None, bool]:
    """Stream a chat; (finish_reason, usage.completion_tokens, whether [DONE] came)."""
    body = {"model": MODEL_A, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    finish, tokens, done = None, None, False
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=bearer(record)) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            first.set()
            for choice in event["choices"]:
                finish = choice["finish_reason"] or finish
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return finish, tokens, done


# -- the pieces on their own ---------------------------------------------------------------


def test_a_limits_change_keeps_buckets_it_does_not_touch_and_the_usage_of_those_it_does():
    now = [0.0]
    ten = KeyLimits(requests_per_min=10)
    admission = Admission(AdmissionConfig(keys={"a": ten, "b": ten}), clock=lambda: now[0])
    for _ in range(4):
        admission.keys.reserve("a", 0)
        admission.keys.reserve("b", 0)
    admission.update_limits(KeyLimits(), {"a": ten, "b": KeyLimits(requests_per_min=5)})
    assert _admitted(admission, "a") == 6  # unchanged: the 4 it used stay used (no refill)
    assert _admitted(admission, "b") == 1  # 5 now, of which 4 were used already


async def test_a_ticket_from_before_a_change_settles_against_the_new_bucket():
    now = [0.0]
    admission = Admission(AdmissionConfig(keys={"a": KeyLimits(tokens_per_min=1000)}), clock=lambda: now[0])
    ticket = await admission.admit(key="a", workload_class=SHORT, tokens=600, timeout=1)
    admission.update_limits(KeyLimits(), {"a": KeyLimits(tokens_per_min=2000)})  # 1400 left: 600 reserved
    with pytest.raises(RateLimitedError):
        admission.keys.reserve("a", 1500)
    ticket.finish(used_tokens=100)  # 500 of the reservation come back, into the new bucket
    assert admission.queues[SHORT].in_flight == 0
    admission.keys.reserve("a", 1900)


def _admitted(admission: Admission, key: str, most: int = 100) -> int:
    for taken in range(most):
        try:
            admission.keys.reserve(key, 0)
        except RateLimitedError:
            return taken
    return most


@pytest.fixture
def router() -> Router:
    # Never started: the reloader only swaps its limits.
    return Router(StaticRegistry.from_spec("127.0.0.1:1"), RouterConfig(), metrics_registry=CollectorRegistry())


def test_a_reload_is_all_or_nothing(tmp_path, router, caplog):
    keys = tmp_path / "keys.jsonl"
    write_keys(keys, [OLD])
    admissions = iter([AdmissionConfig(), ConfigError("--key-limits: not valid JSON (x at char 0)")])

    def read() -> AdmissionConfig:
        value = next(admissions)
        if isinstance(value, Exception):
            raise value
        return value

    reloader = Reloader(keys, LimitsSource(read=read, path=tmp_path / "limits.json"), interval_s=0)
    store = KeyStore(keys, reloader.load().records)
    reloader.bind(router, store)
    write_keys(keys, [NEW])  # a good keys file, but the limits file is broken: neither applies
    assert not reloader.reload()
    assert store.authenticate("sk-old") is not None and store.authenticate("sk-new") is None
    assert "--key-limits: not valid JSON" in caplog.text


def test_a_refused_edit_is_logged_once_and_an_empty_file_refuses_every_key(tmp_path, router, caplog):
    keys = tmp_path / "keys.jsonl"
    write_keys(keys, [OLD])
    reloader = Reloader(keys, LimitsSource.fixed(AdmissionConfig()), interval_s=0)
    store = KeyStore(keys, reloader.load().records)
    reloader.bind(router, store)
    keys.write_text("{not json\n")
    caplog.set_level(logging.INFO, logger="vllm_fleet.gateway.reload")
    assert not reloader.check() and not reloader.check()
    assert [r.levelname for r in caplog.records].count("ERROR") == 1
    assert f"{keys}:1:" in caplog.text
    assert store.authenticate("sk-old") is not None
    keys.write_text("")  # every key revoked: the gateway stays closed, never open
    assert reloader.check()
    assert len(store) == 0 and store.authenticate("sk-old") is None
    assert "holds no keys" in caplog.text


def test_limits_reach_the_router(tmp_path, router):
    keys = tmp_path / "keys.jsonl"
    write_keys(keys, [OLD])
    reloader = Reloader(keys, LimitsSource.fixed(AdmissionConfig(keys={"team": KeyLimits(requests_per_min=5)})),
                        interval_s=0)
    store = KeyStore(keys, reloader.load().records)
    reloader.bind(router, store)
    write_keys(keys, [KeyRecord(OLD.id, OLD.sha256, limits={"tokens_per_min": 50})])
    assert reloader.check()
    assert router.config.admission.keys == {"team": KeyLimits(requests_per_min=5), "old": KeyLimits(tokens_per_min=50)}
