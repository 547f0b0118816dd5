"""Does the class scheduler (#52) run on this vLLM, and does an interactive request get in beside a
full batch? A smoke check for a GPU (vLLM 0.26 schedules asynchronously there, which CPU never
does), against a worker started with a small `--max-num-seqs`:

    python -m vllm_fleet.cli worker --engine vllm --model DIR --max-num-seqs 4 --port 18600 ... &
    python benchmarks/gpu/class_scheduler_smoke.py --worker 127.0.0.1:18600 --batch 4

Fills every slot with batch requests (priority 100), sends one interactive request (priority 0)
once they all decode, and prints the scheduler the worker's Info names, the interactive
request's time to first token and end, and each batch request's end and token count. Exits 1 if
a batch stream lost or repeated tokens (fewer or more than asked for) or the interactive request
ended after every batch request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request


async def stream(client: WorkerClient, request_id: str, prompt: list[int], tokens: int, priority: int) -> dict:
    request = build_request(request_id, [GenerateInput(token_ids=prompt)],
                            SamplingParams(max_tokens=tokens, ignore_eos=True), priority=priority)
    start, first, ids = time.monotonic(), None, 0
    async for chunk in client.generate(request, timeout=300):
        if chunk.token_ids and first is None:
            first = time.monotonic() - start
        ids += len(chunk.token_ids)
    return {"id": request_id, "tokens": ids, "asked": tokens, "ttft_s": first, "end_s": time.monotonic()}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", required=True)
    parser.add_argument("--batch", type=int, default=4, help="batch requests: the worker's --max-num-seqs")
    parser.add_argument("--batch-tokens", type=int, default=1500)
    parser.add_argument("--batch-priority", type=int, default=100, help="the router's batch priority (0 to rehearse on a mock)")
    parser.add_argument("--wait", type=float, default=300, help="seconds to wait for the worker to serve")
    args = parser.parse_args()
    async with WorkerClient(args.worker) as client:
        deadline = time.monotonic() + args.wait
        while True:
            try:
                if await client.health(timeout=2) == "SERVING":
                    break
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline:
                print("worker not serving", file=sys.stderr)
                return 1
            await asyncio.sleep(1)
        scheduler = (await client.info()).settings.get("scheduler_cls")
        batch = [asyncio.create_task(stream(client, f"batch-{i}", [10 + i] * 64, args.batch_tokens,
                                                  args.batch_priority))
                 for i in range(args.batch)]
        while (await client.load()).running < args.batch:   # every slot decoding batch
            for task in batch:
                if task.done():
                    task.result()   # a refused or failed batch request: its error ends the check
            if time.monotonic() > deadline + 120:
                print("batch never filled the slots", file=sys.stderr)
                return 1
            await asyncio.sleep(0.05)
        interactive = await stream(client, "interactive", [7] * 32, 16, 0)
        results = await asyncio.gather(*batch)
    ok = all(r["tokens"] == r["asked"] for r in [*results, interactive])
    ahead = interactive["end_s"] < min(r["end_s"] for r in results)
    print(json.dumps({"scheduler": scheduler, "interactive_ttft_s": interactive["ttft_s"],
                      "interactive_ended_before_every_batch": ahead, "every_stream_whole": ok,
                      "batch": [{k: r[k] for k in ("id", "tokens", "asked", "ttft_s")} for r in results]}, indent=1))
    return 0 if ok and ahead else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
