"""Gateway CPU per streamed SSE event, for one or more checkouts side by side.

For each `src` (a checkout's src/ folder, given to the worker and gateway as PYTHONPATH): a
mock worker streaming 20,000 tokens/s per sequence, a gateway coalescing every 20 ms, 64
streams of 60,000 tokens through it; the gateway's CPU time (all threads, /proc) over the
SSE events it sent. Rounds alternate the order of the checkouts, since the machine's load drifts.

    python benchmarks/gateway_stream_cpu.py src /path/to/old/checkout/src
"""
import asyncio, json, os, signal, subprocess, sys, time

import aiohttp
from vllm_fleet.processes import free_port
PY = sys.executable
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def spawn(src, args):
    env = dict(os.environ, PYTHONPATH=src, VLLM_FLEET_LOG_LEVEL="WARNING")
    return subprocess.Popen([PY, "-m", "vllm_fleet.cli", *args], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
async def one_side(src, streams, tokens):
    wp, gp = free_port(), free_port()
    w = spawn(src, ["worker", "--engine", "mock", "--port", str(wp), "--served-model-name", "m", "--mock-ttft-ms", "1",
                    "--mock-tokens-per-s", "20000", "--mock-max-model-len", "1000000"])
    g = spawn(src, ["gateway", "--workers", f"127.0.0.1:{wp}", "--port", str(gp), "--no-access-log", "--stream-interval-ms", "20"])
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(300):
                try:
                    async with s.get(f"http://127.0.0.1:{gp}/ready") as r:
                        if r.status == 200: break
                except Exception: pass
                await asyncio.sleep(0.2)
            async def stream(n):
                body = {"model": "m", "prompt": "hello", "max_tokens": n, "stream": True}
                got = 0
                async with s.post(f"http://127.0.0.1:{gp}/v1/completions", json=body) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            got += 1
                return got
            await asyncio.gather(*(stream(2000) for _ in range(4)))
            c0 = cpu(g.pid); t0 = time.perf_counter()
            events = sum(await asyncio.gather(*(stream(tokens) for _ in range(streams))))
            el = time.perf_counter() - t0; c = cpu(g.pid) - c0
            return dict(tokens=streams * tokens, events=events, s=round(el, 2), gw_cpu_s=round(c, 2),
                        us_per_event=round(c / events * 1e6, 1), tokens_per_cpu_s=round(streams * tokens / c))
    finally:
        for p in (g, w):
            p.send_signal(signal.SIGTERM)
        for p in (g, w):
            try: p.wait(20)
            except subprocess.TimeoutExpired: os.killpg(p.pid, 9)
async def main():
    srcs = sys.argv[1:]
    for r in range(3):
        for src in (srcs if r % 2 == 0 else srcs[::-1]):
            res = await one_side(src, 64, 60000)
            print(r, src, json.dumps(res), "load", open("/proc/loadavg").read().split()[0], flush=True)
asyncio.run(main())
