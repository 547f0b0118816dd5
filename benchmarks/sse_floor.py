"""The floor of a Python SSE front end: CPU per event of a bare uvicorn app that does nothing else.

    python benchmarks/sse_floor.py [--streams 200] [--seconds 8]

A raw ASGI app under uvicorn (httptools, uvloop, as the gateway runs): one ticker wakes every
10 ms and puts one pre-built event into each open stream's queue; each request's task takes it
and sends it (`await send(...)`), as a front end that handles one token per event must. No gRPC,
no routing, no JSON. Measured like data_path_cpu.py (same client, same token pace): the server's
CPU per event is what any uvicorn-based front end pays at least per streamed token, ours and
`vllm serve`'s alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as overhead  # noqa: E402
from proc_stat import cpu_seconds  # noqa: E402

EVENT = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n'
END = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n'

SERVER = r'''
import asyncio, json, sys, uvicorn
EVENT, END = __EVENTS__
queues = set()

async def ticker():
    while True:
        await asyncio.sleep(0.01)
        for queue in list(queues):
            queue.put_nowait(EVENT)

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        await receive(); asyncio.get_running_loop().create_task(ticker())
        await send({"type": "lifespan.startup.complete"}); await receive(); return
    body = b""
    while True:
        message = await receive(); body += message.get("body", b"")
        if not message.get("more_body"): break
    tokens = json.loads(body)["max_tokens"]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    queue = asyncio.Queue(); queues.add(queue)
    try:
        for _ in range(tokens):
            await send({"type": "http.response.body", "body": await queue.get(), "more_body": True})
    finally:
        queues.discard(queue)
    await send({"type": "http.response.body", "body": END % (tokens, tokens + 1)})

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools", log_level="warning",
            lifespan="on")
'''


async def main(args: argparse.Namespace) -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER.replace("__EVENTS__", repr((EVENT, END))), str(port)])
    try:
        for _ in range(200):
            try:
                await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        pool = overhead.HttpPool(port)
        body = lambda n: json.dumps({"max_tokens": n}).encode()  # noqa: E731
        await asyncio.gather(*(pool.stream("/", body(4), time.perf_counter()) for _ in range(args.streams)))
        tokens_each = int(100 * args.seconds)
        cpu0, started = cpu_seconds(server.pid), time.perf_counter()
        results = await asyncio.gather(*(pool.stream("/", body(tokens_each), time.perf_counter())
                                         for _ in range(args.streams)))
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(server.pid) - cpu0
        pool.close()
        tokens = sum(t for _, t in results)
        print(json.dumps({"streams": args.streams, "tokens": tokens, "s": round(elapsed, 2), "server_cpu_s": round(cpu, 2),
                          "us_per_event": round(cpu / tokens * 1e6, 1), "events_per_cpu_s": round(tokens / cpu),
                          "load": round(os.getloadavg()[0], 2)}), flush=True)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=8.0)
    overhead.run_on_uvloop(main(parser.parse_args()))
