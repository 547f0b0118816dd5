"""Client CPU and context switches per streamed gRPC message, by client transport.

    python benchmarks/probes/grpc_wakeups.py [--rounds 2] [--messages 1000] [--interval-ms 5]

A grpcio server on one core streams 120-byte messages over a bidirectional call; a client on
the other core receives them. With `--interval-ms 5` each message arrives alone, as the
gateway's do at a CPU engine's pace, so the figure is mostly the wake-ups a message causes;
`--interval-ms 0` sends them back to back. Clients, alternating by round, each in its own
process so that gRPC reads its settings fresh:
  aio            grpcio's asyncio API as shipped (uvloop)
  aio-ee-off     the same with GRPC_EXPERIMENTS=-event_engine_client (what the gateway sets)
  grpclib        grpclib over uvloop, if installed: HTTP/2 in Python, no threads
Also printed: the CPU of one bare sleep and wake-up on this machine, the floor under any of them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time

from google.protobuf.wrappers_pb2 import BytesValue

METHOD = "/bench.Stream/Messages"
SKIP = 20  # messages before the measured window: connection set-up is not what we measure


def usage() -> tuple[float, int]:
    """CPU seconds and context switches of this process so far, every thread included."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


async def serve(port: int) -> None:
    import grpc

    async def messages(requests, context):
        async for request in requests:
            count, interval_ms = map(int, request.value.decode().split(","))
            payload = BytesValue(value=b"x" * 120)
            for _ in range(count):
                yield payload
                await asyncio.sleep(interval_ms / 1000)
            return

    handler = grpc.method_handlers_generic_handler("bench.Stream", {
        "Messages": grpc.stream_stream_rpc_method_handler(
            messages, request_deserializer=BytesValue.FromString, response_serializer=BytesValue.SerializeToString)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("serving", flush=True)
    await server.wait_for_termination()


def _ask(count: int, interval_ms: int) -> BytesValue:
    return BytesValue(value=f"{count + SKIP},{interval_ms}".encode())


async def receive_grpcio(port: int, count: int, interval_ms: int) -> tuple[float, int]:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.stream_stream(METHOD, request_serializer=BytesValue.SerializeToString,
                                       response_deserializer=BytesValue.FromString)
        done = asyncio.Event()

        async def requests():
            yield _ask(count, interval_ms)
            await done.wait()

        received, start = 0, None
        async for _ in method(requests()):
            received += 1
            if received == SKIP:
                start = usage()
        end = usage()
        done.set()
    return end[0] - start[0], end[1] - start[1]


async def receive_grpclib(port: int, count: int, interval_ms: int) -> tuple[float, int]:
    from grpclib.client import Channel
    from grpclib.const import Cardinality

    channel = Channel("127.0.0.1", port)
    try:
        async with channel.request(METHOD, Cardinality.STREAM_STREAM, BytesValue, BytesValue) as stream:
            await stream.send_message(_ask(count, interval_ms))
            received, start = 0, None
            while received < count + SKIP and await stream.recv_message() is not None:
                received += 1
                if received == SKIP:
                    start = usage()
            end = usage()
            await stream.cancel()
    finally:
        channel.close()
    return end[0] - start[0], end[1] - start[1]


async def sleep_floor(count: int) -> float:
    start = usage()
    for _ in range(count):
        await asyncio.sleep(0.005)
    return (usage()[0] - start[0]) / count


CLIENTS = {
    "aio": ({"GRPC_EXPERIMENTS": ""}, receive_grpcio),  # grpcio's defaults, whatever the caller set
    "aio-ee-off": ({"GRPC_EXPERIMENTS": "-event_engine_client"}, receive_grpcio),
    "grpclib": ({}, receive_grpclib),
}


def run_client(name: str, port: int, count: int, interval_ms: int, core: int) -> dict:
    env = {**os.environ, **CLIENTS[name][0]}
    done = subprocess.run(["taskset", "-c", str(core), sys.executable, __file__, "--client", name, "--port", str(port),
                           "--messages", str(count), "--interval-ms", str(interval_ms)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"client": name, "failed": (done.stderr.strip().splitlines() or ["?"])[-1]}
    cpu, switches = map(float, done.stdout.split()[-2:])
    return {"client": name, "us_per_message": round(cpu / count * 1e6, 1), "switches_per_message": round(switches / count, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--interval-ms", type=int, default=5)
    parser.add_argument("--port", type=int, default=50917)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import uvloop

    if args.server:
        uvloop.run(serve(args.port))
        return
    if args.client:
        cpu, switches = uvloop.run(CLIENTS[args.client][1](args.port, args.messages, args.interval_ms))
        print(cpu, switches)
        return
    names = [n for n in CLIENTS if n != "grpclib"]
    try:
        import grpclib  # noqa: F401
        names.append("grpclib")
    except ImportError:
        print("grpclib not installed: its row is left out")
    cores = os.sched_getaffinity(0)
    server_core, client_core = (sorted(cores)[-1], sorted(cores)[0]) if len(cores) > 1 else (0, 0)
    server = subprocess.Popen(["taskset", "-c", str(server_core), sys.executable, __file__, "--server",
                               "--port", str(args.port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "serving"
        print(f"bare wake-up floor: {uvloop.run(sleep_floor(1000)) * 1e6:.1f} us of CPU per asyncio.sleep(0.005)")
        rows = []
        for round_ in range(args.rounds):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                row = {"round": round_ + 1, **run_client(name, args.port, args.messages, args.interval_ms, client_core)}
                rows.append(row)
                print(row, flush=True)
    finally:
        server.terminate()
        server.wait()
    print(f"\n{args.messages} messages per client, one every {args.interval_ms} ms, "
          f"load {os.getloadavg()[0]:.2f} at the end ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print("| client | µs CPU per message (rounds) | median | context switches per message |\n|---|---|---:|---|")
    for name in names:
        mine = [r for r in rows if r["client"] == name and "failed" not in r]
        if not mine:
            print(f"| {name} | failed: {next(r['failed'] for r in rows if r['client'] == name)} | | |")
            continue
        print(f"| {name} | {' / '.join(str(r['us_per_message']) for r in mine)} | "
              f"{statistics.median(r['us_per_message'] for r in mine):.0f} | "
              f"{' / '.join(str(r['switches_per_message']) for r in mine)} |")


if __name__ == "__main__":
    main()
