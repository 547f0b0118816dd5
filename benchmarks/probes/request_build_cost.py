"""CPU the gateway spends turning one OpenAI body into the worker request it sends (issue #25).

Runs in this interpreter against whichever vllm_fleet is first on PYTHONPATH, so one checkout's
figure is one run: `PYTHONPATH=OLD/src python request_build_cost.py` beside `PYTHONPATH=NEW/src ...`,
alternated. It times what changed between the two request forms and nothing else: schema parse,
the plan (translate.py: the gateway's checks, the forwarded body, the envelope) and the protobuf
message, for a completion body and a chat body with tools and sampling fields.

    python benchmarks/probes/request_build_cost.py [--repeat 5] [--number 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.gateway.translate import chat_plan, completion_plan, parse_body
from vllm_fleet.protocol.convert import request_to_pb

COMPLETION = {"model": "m", "prompt": "Once upon a time " * 20, "max_tokens": 64, "temperature": 0.7, "top_p": 0.9,
              "stream": True, "seed": 3, "stop": ["\n\n"]}
CHAT = {"model": "m", "stream": True, "max_completion_tokens": 128, "temperature": 0.2, "logprobs": True,
        "top_logprobs": 2, "min_p": 0.05, "logit_bias": {"42": -5},
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": "{\"city\": \"Paris\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 21 C"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]}


def one(kind: str, raw: bytes, config: GatewayConfig) -> None:
    if kind == "chat":
        plan = chat_plan(parse_body(ChatCompletionRequest, raw), request_id="r", session_id="", config=config,
                         max_model_len=4096)
    else:
        plan = completion_plan(parse_body(CompletionRequest, raw), request_id="r", session_id="", config=config,
                               max_model_len=4096)
    request_to_pb(plan.request).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    config = GatewayConfig()
    for kind, body in (("completion", COMPLETION), ("chat", CHAT)):
        raw = json.dumps(body).encode()
        one(kind, raw, config)  # warm
        runs = []
        for _ in range(args.repeat):
            started = time.process_time()
            for _ in range(args.number):
                one(kind, raw, config)
            runs.append((time.process_time() - started) / args.number * 1e6)
        print(f"{kind}: {statistics.median(runs):.1f} µs CPU per request (median of {args.repeat} x {args.number}; "
              f"runs {', '.join(f'{r:.1f}' for r in runs)})", flush=True)


if __name__ == "__main__":
    main()
