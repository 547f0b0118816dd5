"""--tls-cert/--tls-key: the gateway serves HTTPS, and the OpenAI client talks to it."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import httpx
import openai
import pytest

from gateway_support import MODEL_B

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a test certificate")


@pytest.fixture
def certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


async def test_https(start_gateway, mock_fleet, certificate):
    cert, key = certificate
    server = await start_gateway([mock_fleet["b"][0].address], tls_cert=cert, tls_key=key)
    assert server.url.startswith("https://")
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=cert)) as http:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", http_client=http, max_retries=0)
        reply = await client.chat.completions.create(model=MODEL_B, messages=[{"role": "user", "content": "tls"}],
                                                     max_tokens=3)
        assert reply.usage.completion_tokens == 3
    async with httpx.AsyncClient() as plain:  # the CA is unknown to a default client
        with pytest.raises(httpx.ConnectError):
            await plain.get(server.url + "/health")
