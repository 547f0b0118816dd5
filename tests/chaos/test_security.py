"""Security: TLS at the gateway, mTLS from the gateway to workers, and keys that never reach a worker."""

from __future__ import annotations

import hmac
import ssl

import httpx
import pytest

from certs import make_ca, make_leaf
from chaos_support import worker_requests
from support import WorkerProcess, free_port, wait_until, worker_env
from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.gateway.keys import KeyRecord, KeyStore, hash_key, write_keys

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def tls_worker(pki):
    """A mock worker serving gRPC over TLS, requiring client certificates of the fleet CA."""
    cert, key = pki["server"]
    worker = WorkerProcess(args=["--engine", "mock", "--served-model-name", "chaos", "--mock-tokens-per-s", "500",
                                 "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", pki["ca"]],
                           env=worker_env(), port=free_port()).start()
    client_cert, client_key = pki["client"]
    options = ClientOptions(tls_ca=open(pki["ca"], "rb").read(), tls_cert=open(client_cert, "rb").read(),
                            tls_key=open(client_key, "rb").read())
    client = WorkerClient(worker.address, options)
    try:
        await wait_until(lambda: _serving(client), timeout=30, message="the TLS worker to serve")
        yield worker
    finally:
        await client.close()
        worker.kill()


async def _serving(client: WorkerClient) -> bool:
    return await client.health(timeout=1.0) == "SERVING"


@pytest.fixture
def pki(tmp_path):
    ca, ca_key = make_ca(tmp_path, "fleet-ca")
    other_ca, other_key = make_ca(tmp_path, "other-ca")
    server = make_leaf(tmp_path, "worker", "fleet-ca", ca_key, server=True)
    gateway_server = make_leaf(tmp_path, "gateway", "fleet-ca", ca_key, server=True)
    client = make_leaf(tmp_path, "gateway-client", "fleet-ca", ca_key, server=False)
    stranger = make_leaf(tmp_path, "stranger", "other-ca", other_key, server=False)
    return {"ca": str(ca), "server": tuple(map(str, server)), "gateway": tuple(map(str, gateway_server)),
            "client": tuple(map(str, client)), "stranger": tuple(map(str, stranger))}


async def _chat(url: str, verify, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(verify=verify, timeout=30) as http:
        return await http.post(url + "/v1/chat/completions", headers=headers, json={
            "model": "chaos", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})


async def test_https_gateway_over_mtls_workers(tls_worker, start_gateway, pki):
    """Client → HTTPS gateway → mTLS worker: a request succeeds end to end; a gateway without a
    client certificate, or with one from another CA, never gets a worker to serve."""
    worker = tls_worker
    gw_cert, gw_key = pki["gateway"]
    client_cert, client_key = pki["client"]
    server = await start_gateway([worker.address], tls_cert=gw_cert, tls_key=gw_key, worker_tls_ca=pki["ca"],
                                 worker_tls_cert=client_cert, worker_tls_key=client_key)
    assert server.url.startswith("https://")
    reply = await _chat(server.url, ssl.create_default_context(cafile=pki["ca"]))
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4

    for name, tls in {"no client certificate": {}, "a certificate of another CA": dict(
            zip(("worker_tls_cert", "worker_tls_key"), pki["stranger"]))}.items():
        refused = await start_gateway([worker.address], ready_timeout_s=2, worker_tls_ca=pki["ca"], **tls)
        assert refused.router.models() == [], f"a gateway with {name} reached the worker"
        reply = await _chat(refused.url, True)
        assert reply.status_code in (404, 503), (name, reply.text)  # unknown model / no worker


async def test_plaintext_gateway_cannot_reach_a_tls_worker(tls_worker, start_gateway):
    server = await start_gateway([tls_worker.address], ready_timeout_s=2)
    assert server.router.models() == []
    assert (await _chat(server.url, True)).status_code in (404, 503)


async def test_missing_wrong_or_revoked_keys_never_reach_a_worker(workers, start_gateway, tmp_path):
    metrics_port = free_port()
    [worker] = await workers(1, mock_tokens_per_s=500, metrics_port=metrics_port)
    path = tmp_path / "keys.jsonl"
    write_keys(path, [KeyRecord("good", hash_key("sk-good")), KeyRecord("gone", hash_key("sk-gone"))])
    server = await start_gateway([worker.address], api_key_file=str(path))
    assert (await _chat(server.url, True, "sk-gone")).status_code == 200
    write_keys(path, [KeyRecord("good", hash_key("sk-good"))])
    assert server.reload()  # what SIGHUP does: the revocation holds from the next request on
    await wait_until(lambda: _count_is(metrics_port, 1), timeout=10, message="the worker to count one request")
    for key in (None, "", "sk-goo", "sk-gone", "sk-good" + "x" * 10_000, "SK-GOOD"):
        reply = await _chat(server.url, True, key)
        assert reply.status_code == 401, (key, reply.status_code, reply.text)
        assert reply.json()["error"]["message"]
    assert await worker_requests(metrics_port) == 1, "a refused request reached the worker"
    assert (await _chat(server.url, True, "sk-good")).status_code == 200
    await wait_until(lambda: _count_is(metrics_port, 2), timeout=10, message="the worker to count the good request")


async def _count_is(metrics_port: int, expected: int) -> bool:
    return await worker_requests(metrics_port) == expected


def test_key_check_is_a_constant_time_comparison_of_fixed_length_hashes(tmp_path, monkeypatch):
    """Whatever is presented, the stored key is compared as a 32-byte sha256 digest through
    hmac.compare_digest, so the comparison time cannot depend on how many leading characters
    of the real key a guess got right (the timing itself is measured in benchmarks/reliability.py)."""
    path = tmp_path / "keys.jsonl"
    secret = "sk-fleet-" + "s" * 40
    write_keys(path, [KeyRecord("k", hash_key(secret))])
    store = KeyStore(path)
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    for guess in ("", "s", secret[:10], secret[:-1], secret + "x", "x" * 5000, secret):
        assert (store.authenticate(guess) is not None) == (guess == secret)
    assert calls, "the key check never went through hmac.compare_digest"
    assert set(calls) == {(32, 32)}
