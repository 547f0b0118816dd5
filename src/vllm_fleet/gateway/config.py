"""The gateway's settings: one pydantic model that also builds the CLI options."""

from __future__ import annotations

from pydantic import Field, model_validator

from vllm_fleet.config import FleetModel

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class GatewayConfig(FleetModel):
    """The OpenAI-compatible HTTP gateway in front of the router."""

    host: str = Field("127.0.0.1", description="Address to listen on; anything but loopback requires --api-key-file")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0 picks a free one; the log line says which)")
    api_key_file: str | None = Field(
        None, description="Keys file (JSON lines: id, sha256, limits); manage it with `vllm-fleet gateway keys`"
    )
    tls_cert: str | None = Field(None, description="PEM certificate: serve HTTPS")
    tls_key: str | None = Field(None, description="PEM private key for --tls-cert")
    worker_tls_ca: str | None = Field(
        None, description="PEM CA that signed the workers' certificates: reach workers over TLS (workers' --tls-cert)"
    )
    worker_tls_cert: str | None = Field(
        None, description="PEM client certificate presented to workers (mTLS: workers' --tls-client-ca)"
    )
    worker_tls_key: str | None = Field(None, description="PEM private key for --worker-tls-cert")
    worker_multiplex: bool = Field(
        True, description="All requests to a worker over one GenerateMany call, chunks batched per message "
        "(--no-worker-multiplex: one gRPC call per request)"
    )
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest request body accepted (bigger: HTTP 413)")
    max_header_bytes: int = Field(
        16 * 1024, ge=1024,
        description="Largest request line + headers accepted, in bytes (bigger: HTTP 431 and the connection closes)",
    )
    http_keep_alive_s: float = Field(
        75.0, gt=0,
        description="How long an idle client connection stays open. Longer than the idle timeouts of the clients and "
        "load balancers in front (httpx and OpenAI's SDKs 5 s, AWS ALB 60 s): when the server closes first, a client "
        "sending on the connection at that moment gets a connection error (uvicorn's and vllm serve's default is 5 s)",
    )
    reload_interval_s: float = Field(
        2.0, ge=0,
        description="How often the keys file and a --key-limits @FILE are checked for changes, which reloads "
        "keys and limits without a restart (0: only on SIGHUP)",
    )
    max_n: int = Field(16, ge=1, description="Largest `n` (samples per prompt) accepted")
    max_prompts: int = Field(256, ge=1, description="Most prompts in one /v1/completions request")
    max_tokens_limit: int | None = Field(
        None, ge=1, description="Largest max_tokens accepted (default: the model's context length)"
    )
    max_top_logprobs: int = Field(20, ge=0, description="Most top logprobs per token accepted")
    prompt_bytes_per_token: float = Field(
        6.0, gt=0,
        description="Prompt check before routing: a text prompt counts as at least bytes/this tokens; "
        "requests certain to exceed the context are refused with 400 (the worker checks exactly)",
    )
    stream_interval_ms: int = Field(
        0, ge=0, description="Ask workers to coalesce streamed tokens over this many ms (fewer, larger SSE events)"
    )
    request_timeout_s: float = Field(600.0, gt=0, description="Deadline of one request, end to end")
    ready_workers: int = Field(1, ge=1, description="/ready says ready when at least this many workers serve")
    access_log: bool = Field(True, description="Log one structured line per request")
    batch_dir: str | None = Field(
        None, description="Batch API state (/v1/files, /v1/batches): an SQLite file and the uploaded and result "
        "files beside it; every process of --processes N and every restart must see the same one "
        "(default: <cache>/vllm-fleet/batch)"
    )
    batch_max_file_bytes: int = Field(
        100 * 1024 * 1024, ge=1024, description="Largest file accepted by POST /v1/files (bigger: HTTP 413)"
    )
    batch_max_lines: int = Field(50_000, ge=1, description="Most requests (lines) in one batch input file")
    batch_concurrency: int = Field(8, ge=1, description="Lines of one batch in flight at once")
    batch_stream_interval_ms: int = Field(
        250, ge=0, description="Batch API lines: workers send a line's tokens at most this often (its first token "
        "at once); a line is answered whole, so per-step chunks would only spend the CPU the chat streams on the "
        "same workers need; 0: every engine step"
    )
    batch_line_attempts: int = Field(
        3, ge=1, description="Tries per batch line when the fleet answers 429/502/503/504 (then its error line)"
    )
    batch_lease_s: float = Field(
        30.0, gt=0, description="A batch's runner holds it for this long, renewed at a third of it; if the process "
        "dies, another gateway process takes the batch over after this"
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> GatewayConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if (self.worker_tls_cert is None) != (self.worker_tls_key is None):
            raise ValueError("--worker-tls-cert and --worker-tls-key go together")
        if self.worker_tls_cert is not None and self.worker_tls_ca is None:
            raise ValueError("--worker-tls-cert (mTLS) needs --worker-tls-ca to check the workers' certificates")
        if not self.loopback_only and self.api_key_file is None:
            # Without keys anyone who reaches the port can spend the fleet's GPUs.
            raise ValueError(
                f"refusing to listen on {self.host} without API keys: pass --api-key-file "
                "(create one with `vllm-fleet gateway keys add`) or listen on 127.0.0.1"
            )
        return self

    @property
    def loopback_only(self) -> bool:
        return self.host in LOOPBACK_HOSTS
