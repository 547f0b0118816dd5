"""What one received gRPC message costs a Python client when messages arrive paced, one per wake-up.

    python benchmarks/grpc_client_floor.py [--streams 2] [--messages 1000] [--interval-ms 10] [--rounds 2]

At a CPU engine's pace (one step every ~100 ms, and one message per step per worker) nearly
every message from a worker wakes the gateway on its own, so the cost per wake-up is what the
gateway pays per message. This measures that floor for the clients a Python gateway can use,
each reading `--streams` server streams of 200-byte messages sent every `--interval-ms` by a
grpcio server in another process, on uvloop as the gateway runs:

1. raw: a uvloop protocol reading a TCP socket that gets one 200-byte write per interval from
   the server process (no gRPC): the wake-up itself and one read;
2. grpcio aio with the EventEngine client off (as the gateway runs it): grpcio's poller thread
   reads the socket and wakes the loop;
3. grpclib (pure-Python HTTP/2 on the loop, one thread), if installed (`pip install grpclib`).

Each client runs in its own process; CPU is that process's (user + system, all threads) per
message received, with its context switches. Rounds alternate the order.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import socket
import subprocess
import sys
import time

SERVICE, METHOD = "bench.Floor", "Stream"
PAYLOAD = 200


def serve(port_file: str) -> None:
    import grpc

    async def stream(request: bytes, context):
        count, interval_ms = map(int, request.decode().split(","))
        for _ in range(count):
            await asyncio.sleep(interval_ms / 1000)
            yield b"x" * PAYLOAD

    async def raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count, interval_ms = map(int, (await reader.readline()).decode().split(","))
        for _ in range(count):
            await asyncio.sleep(interval_ms / 1000)
            writer.write(b"x" * PAYLOAD)
        writer.close()

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_stream_rpc_method_handler(stream)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        raw_server = await asyncio.start_server(raw, "127.0.0.1", 0)
        raw_port = raw_server.sockets[0].getsockname()[1]
        with open(port_file + ".tmp", "w") as f:
            f.write(f"{port} {raw_port}")
        os.rename(port_file + ".tmp", port_file)
        await server.wait_for_termination()

    asyncio.run(main())


def usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


async def measure(one, streams: int) -> dict:
    await asyncio.gather(*(one() for _ in range(streams)))  # warm-up: connect, first calls
    cpu0, switches0 = usage()
    counts = await asyncio.gather(*(one() for _ in range(streams)))
    cpu1, switches1 = usage()
    messages = sum(counts)
    return {"messages": messages, "us_per_message": round((cpu1 - cpu0) / messages * 1e6, 1),
            "switches_per_message": round((switches1 - switches0) / messages, 2)}


def client(kind: str, port: int, raw_port: int, streams: int, messages: int, interval_ms: int) -> dict:
    import uvloop

    request = f"{messages},{interval_ms}".encode()

    async def raw() -> dict:
        loop = asyncio.get_running_loop()

        async def one() -> int:
            done = loop.create_future()

            class Reader(asyncio.Protocol):
                received = 0

                def data_received(self, data: bytes) -> None:
                    self.received += 1

                def connection_lost(self, exc) -> None:
                    done.set_result(self.received)

            transport, _ = await loop.create_connection(Reader, "127.0.0.1", raw_port)
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport.write(request + b"\n")
            return await done

        return await measure(one, streams)

    async def grpcio_aio() -> dict:
        import grpc

        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        call = channel.unary_stream(f"/{SERVICE}/{METHOD}")

        async def one() -> int:
            return sum([1 async for _ in call(request)])

        return await measure(one, streams)

    async def grpclib_client() -> dict:
        from grpclib.client import Channel
        from grpclib.const import Cardinality

        class Bytes:
            __content_subtype__ = "proto"

            def encode(self, message, message_type):
                return message

            def decode(self, data, message_type):
                return data

        channel = Channel("127.0.0.1", port, codec=Bytes())

        async def one() -> int:
            async with channel.request(f"/{SERVICE}/{METHOD}", Cardinality.UNARY_STREAM, bytes, bytes) as stream:
                await stream.send_message(request, end=True)
                return sum([1 async for _ in stream])

        try:
            return await measure(one, streams)
        finally:
            channel.close()

    return uvloop.run({"raw": raw, "grpcio": grpcio_aio, "grpclib": grpclib_client}[kind]())


def main(args) -> None:
    port_file = f"/tmp/grpc-floor-{os.getpid()}.port"
    server = subprocess.Popen([sys.executable, __file__, "--serve", port_file])
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the grpcio server did not start")
            time.sleep(0.05)
        port, raw_port = map(int, open(port_file).read().split())
        kinds = ["raw", "grpcio"]
        if importlib.util.find_spec("grpclib") is not None:
            kinds.append("grpclib")
        else:
            print("grpclib is not installed: measuring raw and grpcio only", flush=True)
        rows = []
        for round_ in range(args.rounds):
            for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                env = {**os.environ, "GRPC_EXPERIMENTS": "-event_engine_client"} if kind == "grpcio" else None
                done = subprocess.run([sys.executable, __file__, "--client", kind, "--port", str(port),
                                       "--raw-port", str(raw_port),
                                       "--streams", str(args.streams), "--messages", str(args.messages),
                                       "--interval-ms", str(args.interval_ms)],
                                      env=env, capture_output=True, text=True, check=True)
                row = {"round": round_ + 1, "client": kind, **json.loads(done.stdout.strip().splitlines()[-1])}
                rows.append(row)
                print(json.dumps(row), flush=True)
        print(f"\n{args.streams} streams, a {PAYLOAD}-byte message every {args.interval_ms} ms each, "
              f"{args.messages} per stream, uvloop; load average {os.getloadavg()[0]:.2f}\n")
        print("| client | µs of CPU per message (rounds) | context switches per message |\n|---|---|---|")
        for kind in kinds:
            mine = [r for r in rows if r["client"] == kind]
            print(f"| {kind} | {' / '.join(str(r['us_per_message']) for r in mine)} | "
                  f"{' / '.join(str(r['switches_per_message']) for r in mine)} |")
    finally:
        server.terminate()
        server.wait(10)
        if os.path.exists(port_file):
            os.unlink(port_file)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--interval-ms", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--raw-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
    elif args.client:
        print(json.dumps(client(args.client, args.port, args.raw_port, args.streams, args.messages,
                                args.interval_ms)))
    else:
        main(args)
