"""Async client for one worker: generate (an async iterator of chunks), pool (a pooling request:
embeddings, score, ...), abort, info, load, health,
its LoRA adapters (load_adapter, unload_adapter, list_adapters), the streams a router follows:
its Loads (loads) and its engine's KV-cache events (kv_events), and its model's tokenizer files
(tokenizer_files).

One long-lived channel per client. By default every generate() of a client shares one
GenerateMany call (mux.py: the worker batches all ready chunks into one message); with
`multiplex=False`, or against a worker without it, each generate() is its own Generate call.
Either way, cancelling the iteration (breaking out of `async for`, cancelling the task, or
`aclose()`) stops the request, and the worker aborts the engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vllm_fleet.client.errors import error_from_rpc
from vllm_fleet.client.loads import LoadFeed
from vllm_fleet.client.mux import Multiplexer, MuxNeverAnswered, MuxUnsupported
from vllm_fleet.errors import (
    IntrospectUnsupportedError,
    KvEventsUnsupportedError,
    TokenizerFilesError,
    WorkerTimeoutError,
)
from vllm_fleet.protocol import SERVICE_NAME, worker_pb2 as pb, worker_pb2_grpc
from vllm_fleet.protocol.convert import adapters_from_pb, chunk_from_pb, info_from_pb, load_from_pb, request_to_pb
from vllm_fleet.protocol.kv_events import KvEventBatch, batch_from_pb
from vllm_fleet.protocol.pooling import PoolRequest, PoolResult
from vllm_fleet.protocol.tokenizer_files import FileAssembler
from vllm_fleet.protocol.types import Adapter, Chunk, GenerateRequest, WorkerInfo, WorkerLoad

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientOptions:
    """Channel settings shared by every client of a pool."""

    # Pings keep idle connections alive through NAT/LBs and reveal dead peers in ~keepalive_timeout.
    keepalive_time_ms: int = 10_000
    keepalive_timeout_ms: int = 5_000
    max_message_mb: int = 64
    # Short backoff so a restarted worker is reachable again within a second or two.
    initial_reconnect_backoff_ms: int = 200
    max_reconnect_backoff_ms: int = 2_000
    # How long one connection attempt may take to finish its handshake. gRPC reads this from
    # `grpc.min_reconnect_backoff_ms` (its MIN_CONNECT_TIMEOUT; 20 s unset); when it was the 200 ms
    # backoff, a worker slow to answer its first SETTINGS frame on a loaded host failed the call.
    # A dead local worker still fails at once (the connection is refused, not timed out).
    min_connect_timeout_ms: int = 5_000
    tls_ca: bytes | None = None            # PEM of the CA that signed the workers' certificates
    tls_cert: bytes | None = None          # our certificate, for mTLS
    tls_key: bytes | None = None
    tls_server_name: str | None = None     # override the name checked against the certificate
    # All streams of a client over one GenerateMany call (a message per engine step, not per
    # token per stream); False: one Generate call per request.
    multiplex: bool = True

    def channel_options(self) -> list[tuple[str, object]]:
        size = self.max_message_mb * 1024 * 1024
        options: list[tuple[str, object]] = [
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            ("grpc.initial_reconnect_backoff_ms", self.initial_reconnect_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", self.min_connect_timeout_ms),
            ("grpc.max_reconnect_backoff_ms", self.max_reconnect_backoff_ms),
            # Each worker address gets its own subchannel; do not share one across clients.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return options


class WorkerClient:
    """Client for the worker at `address` (host:port). Create and use it inside one event loop."""

    def __init__(self, address: str, options: ClientOptions | None = None) -> None:
        self.address = address
        self.options = options or ClientOptions()
        if self.options.tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self.options.tls_ca,
                private_key=self.options.tls_key,
                certificate_chain=self.options.tls_cert,
            )
            self._channel = grpc.aio.secure_channel(address, credentials, options=self.options.channel_options())
        else:
            self._channel = grpc.aio.insecure_channel(address, options=self.options.channel_options())
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._multiplex = self.options.multiplex
        self._mux: Multiplexer | None = None
        self._streamed_load: WorkerLoad | None = None
        self._next_load: asyncio.Future | None = None  # what next_pushed_load callers wait on

    async def generate(self, request: GenerateRequest, *, timeout: float | None = None) -> AsyncIterator[Chunk]:
        """Stream the chunks of `request`, within `timeout` seconds if given. Raises errors from
        `vllm_fleet.errors`."""
        if self._multiplex:
            try:
                # aclosing: a consumer that stops early closes this generator at its yield; the
                # inner one must then close at once (its finally tells the worker to abort), not
                # whenever the garbage collector finalizes it.
                async with contextlib.aclosing(self._open_mux().generate(request, timeout=timeout)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            except MuxUnsupported:
                logger.info("worker %s has no GenerateMany; one call per request from now on", self.address)
                self._multiplex = False
            except MuxNeverAnswered as exc:
                logger.info("stream call to %s failed before any answer (%s); request %s takes its own call",
                            self.address, exc, request.request_id)
        async with contextlib.aclosing(self._generate_call(request, timeout=timeout)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _generate_call(self, request: GenerateRequest, *, timeout: float | None) -> AsyncIterator[Chunk]:
        """One Generate call for this request (the worker sees `timeout` as its deadline)."""
        call = self._stub.Generate(request_to_pb(request), timeout=timeout)
        try:
            while (msg := await call.read()) is not grpc.aio.EOF:
                yield chunk_from_pb(msg)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.address) from None
        finally:
            # Reached on normal end too; cancel() is then a no-op. On an early exit it tells
            # the worker to abort the engine request.
            call.cancel()

    async def abort(self, request_id: str, *, timeout: float = 5.0) -> bool:
        try:
            reply = await self._stub.Abort(pb.AbortRequest(request_id=request_id), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.address) from None
        return reply.found

    async def info(self, *, timeout: float = 5.0) -> WorkerInfo:
        try:
            return info_from_pb(await self._stub.Info(pb.InfoRequest(), timeout=timeout))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.address) from None

    async def kv_events(self, *, after_sequence: int = 0, epoch: str = "") -> AsyncIterator[KvEventBatch]:
        """The worker's KV-cache event batches (protocol/kv_events.py): those after `after_sequence`
        of `epoch` when the worker still has them, else a snapshot first; then live ones until the
        worker stops. Raises KvEventsUnsupportedError from a worker without events (or without the
        call), other errors of `vllm_fleet.errors` as the other calls do."""
        call = self._stub.KvEvents(pb.KvEventsRequest(after_sequence=after_sequence, epoch=epoch))
        try:
            while (msg := await call.read()) is not grpc.aio.EOF:
                yield batch_from_pb(msg)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                raise KvEventsUnsupportedError(f"worker {self.address}: {exc.details()}", worker=self.address) from None
            raise error_from_rpc(exc, self.address) from None
        finally:
            call.cancel()

    def _open_mux(self) -> Multiplexer:
        """The GenerateMany call, opened anew if there is none or it failed."""
        if self._mux is None or self._mux.failed is not None:
            self._mux = Multiplexer(self._stub, self.address, on_load=self._note_streamed_load)
        return self._mux

    def _note_streamed_load(self, load: WorkerLoad) -> None:
        self._streamed_load = load
        arrived, self._next_load = self._next_load, None
        if arrived is not None and not arrived.done():
            arrived.set_result(load)

    def loads(self, every_s: float, *, health_every_s: float,
              check: asyncio.Event | None = None) -> AsyncIterator[WorkerLoad]:
        """Each fresh Load of the worker, `health` always set, about every `every_s` seconds,
        from whichever route brings it: pushed or attached to the GenerateMany call, else polled
        (Load call and health check). Which wins is written once, in client/loads.py. Set `check`
        to have the worker's health service asked at once. `aclose()` it when done."""
        return LoadFeed(self, every_s, health_every_s=health_every_s, check=check).loads()

    # The routes loads() reads; a router takes loads() rather than choosing among them.

    def pushes_load(self, every_s: float) -> bool:
        """Ask the worker to push its Load over the GenerateMany call at least every `every_s`
        seconds, opening the call if there is none; whether it does so on the call open now.
        False with `multiplex` off, against a worker without GenerateMany or without pushes (it
        never says it pushes), and until the worker's first answer: then poll with `load()`."""
        if not self._multiplex:
            return False
        if self._mux is not None and isinstance(self._mux.failed, MuxUnsupported):
            logger.info("worker %s has no GenerateMany; one call per request from now on", self.address)
            self._multiplex = False
            return False
        mux = self._open_mux()
        mux.ask_load_every(every_s)
        return mux.pushes_load and mux.failed is None

    async def next_pushed_load(self, timeout: float) -> WorkerLoad | None:
        """The next Load the worker sends on the GenerateMany call (see `pushes_load`); None if
        none comes within `timeout` or the call ends first."""
        mux = self._mux
        if mux is None or mux.failed is not None:
            return None
        if self._next_load is None:  # shared: every caller gets the same next Load
            self._next_load = asyncio.get_running_loop().create_future()
        arrived = self._next_load
        await asyncio.wait((arrived, mux.ended), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return arrived.result() if arrived.done() else None

    def take_streamed_load(self) -> WorkerLoad | None:
        """The newest Load the worker attached to a stream call since the last take, or None:
        a poller that gets one can skip its own Load call (one unary call less per interval)."""
        load, self._streamed_load = self._streamed_load, None
        return load

    async def load(self, *, timeout: float = 2.0) -> WorkerLoad:
        try:
            return load_from_pb(await self._stub.Load(pb.LoadRequest(), timeout=timeout))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.address) from None

    async def pool(self, request: PoolRequest, *, timeout: float | None = None) -> PoolResult:
        """One pooling request (protocol/pooling.py), answered whole. Cancelling the await cancels
        the call, and the worker aborts its engine requests."""
        message = pb.PoolRequest(request_id=request.request_id, endpoint=request.endpoint,
                                 body_json=request.body_json, priority=request.priority)
        try:
            reply = await self._stub.Pool(message, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.address) from None
        return PoolResult(body_json=reply.body_json, prompt_tokens=reply.prompt_tokens)

    async def load_adapter(self, name: str, path: str, *, timeout: float = 120.0) -> tuple[list[Adapter], int]:
        """Load LoRA adapter `name` from `path` (a folder on the worker's machine); the adapters
        held afterwards and the worker's slots. Loading what is loaded from the same path is a no-op."""
        try:
            return adapters_from_pb(await self._stub.LoadAdapter(pb.LoadAdapterRequest(name=name, path=path),
                                                                 timeout=timeout))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.address) from None

    async def unload_adapter(self, name: str, *, timeout: float = 300.0) -> tuple[list[Adapter], int]:
        """Unload `name` once the requests running on it finished (`timeout` covers that wait)."""
        try:
            return adapters_from_pb(await self._stub.UnloadAdapter(pb.UnloadAdapterRequest(name=name),
                                                                   timeout=timeout))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.address) from None

    async def list_adapters(self, *, timeout: float = 5.0) -> tuple[list[Adapter], int]:
        try:
            return adapters_from_pb(await self._stub.ListAdapters(pb.ListAdaptersRequest(), timeout=timeout))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, self.address) from None

    async def tokenizer_files(self, dest_dir: str | os.PathLike[str], *, timeout: float = 60.0) -> list[str]:
        """Write the worker's tokenizer files into `dest_dir` (created if missing); their names.

        Each file appears whole or not at all; names off the allow-list are refused
        (protocol/tokenizer_files.py). Raises TokenizerFilesError when the worker has none to send
        or sends what cannot be kept, other errors from `vllm_fleet.errors` as every call does."""
        files = FileAssembler(dest_dir)
        call = self._stub.TokenizerFiles(pb.TokenizerFilesRequest(), timeout=timeout)
        try:
            async for chunk in call:
                files.add(chunk.name, chunk.data, chunk.last)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise TokenizerFilesError(f"worker {self.address}: {exc.details()}", worker=self.address) from None
            raise error_from_rpc(exc, self.address) from None
        finally:
            call.cancel()  # a refused file ends the call early; a no-op once it ended
        return files.finish()

    async def introspect(self, endpoint: str, body: dict, *, timeout: float = 60.0) -> object:
        """vLLM's JSON answer at one of `vllm serve`'s token/render endpoints (tokenize, detokenize,
        render_chat, render_completion) for a body in vLLM's shape. IntrospectUnsupportedError
        where the worker cannot answer (mock engine, vLLM 0.26, a worker older than the call)."""
        request = pb.IntrospectRequest(endpoint=endpoint, body=json.dumps(body).encode())
        try:
            answer = await self._stub.Introspect(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                raise IntrospectUnsupportedError(f"worker {self.address}: {exc.details()}",
                                                 worker=self.address) from None
            raise error_from_rpc(exc, self.address) from None
        return json.loads(answer.body)

    async def health(self, *, timeout: float = 2.0, service: str = SERVICE_NAME) -> str:
        """The worker's health status name: SERVING, NOT_SERVING, or UNREACHABLE."""
        try:
            reply = await self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.aio.AioRpcError:
            return "UNREACHABLE"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    async def wait_serving(self, *, timeout: float, poll_s: float = 0.2) -> None:
        """Wait until health says SERVING; raise WorkerTimeoutError after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        status = "UNREACHABLE"
        while loop.time() < deadline:
            status = await self.health(timeout=max(0.1, min(2.0, deadline - loop.time())))
            if status == "SERVING":
                return
            await asyncio.sleep(poll_s)
        raise WorkerTimeoutError(f"worker {self.address} not SERVING after {timeout:.0f}s (last: {status})",
                                 worker=self.address)

    async def close(self) -> None:
        if self._mux is not None:
            mux, self._mux = self._mux, None
            await mux.close()
        await self._channel.close()

    async def __aenter__(self) -> WorkerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
