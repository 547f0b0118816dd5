"""The naive baseline: Hugging Face transformers `generate` behind a minimal OpenAI-ish server.

One request at a time (a lock around `generate`, no batching, no paged KV cache), streamed
with TextIteratorStreamer. It answers GET /v1/models, POST /v1/completions and
POST /v1/chat/completions with `stream: true` (SSE, usage on the last event) or without.
`ignore_eos` is honoured (min_new_tokens = max_tokens) so every system produces the same
number of tokens. A client that goes away stops its generation, so a backlog left over from
one benchmark rate does not slow down the next.

    python benchmarks/baselines/hf_server.py --port 8300 [--model DIR] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer


class _Cancelled(StoppingCriteria):
    """Stops generate() once the client has gone."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        return self.event.is_set()


class HfServer:
    def __init__(self, model_dir: str, name: str, dtype: torch.dtype) -> None:
        self.name = name
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        self.lock = threading.Lock()  # the naive part: one generate() at a time

    def encode(self, body: dict) -> torch.Tensor:
        if "messages" in body:
            return self.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, return_tensors="pt",
                                                      return_dict=False)
        return self.tokenizer(body["prompt"], return_tensors="pt").input_ids

    def generate(self, input_ids: torch.Tensor, body: dict, streamer: TextIteratorStreamer, cancel: threading.Event,
                 result: dict) -> None:
        max_tokens = int(body.get("max_tokens") or 16)
        temperature = float(body.get("temperature") or 0.0)
        try:
            with self.lock:
                if cancel.is_set():
                    return
                with torch.inference_mode():
                    output = self.model.generate(
                        input_ids, attention_mask=torch.ones_like(input_ids), streamer=streamer,
                        max_new_tokens=max_tokens, min_new_tokens=max_tokens if body.get("ignore_eos") else None,
                        do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                        top_p=None, top_k=None, stopping_criteria=StoppingCriteriaList([_Cancelled(cancel)]),
                        pad_token_id=self.tokenizer.eos_token_id,
                    )
            result["completion_tokens"] = int(output.shape[1] - input_ids.shape[1])
        except Exception as exc:  # reported to the client as a stream error
            result["error"] = str(exc)
        finally:
            streamer.end()


def _event(kind: str, rid: str, model: str, text: str | None, finish: str | None, usage: dict | None) -> str:
    if kind == "chat":
        choice = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
        obj = "text_completion"
    payload = {"id": rid, "object": obj, "created": int(time.time()), "model": model,
               "choices": [choice] if usage is None else [], "usage": usage}
    return f"data: {json.dumps(payload)}\n\n"


def build_app(server: HfServer) -> Starlette:
    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": server.name, "object": "model", "owned_by": "hf"}]})

    async def complete(request: Request):
        body = await request.json()
        kind = "chat" if request.url.path.endswith("chat/completions") else "text"
        if kind == "chat" and not isinstance(body.get("messages"), list):
            return JSONResponse({"error": {"message": "messages is required", "type": "invalid_request_error"}}, 400)
        if kind == "text" and not isinstance(body.get("prompt"), str):
            return JSONResponse({"error": {"message": "prompt must be a string", "type": "invalid_request_error"}}, 400)
        input_ids = server.encode(body)
        streamer = TextIteratorStreamer(server.tokenizer, skip_prompt=True, skip_special_tokens=True)
        cancel, result = threading.Event(), {}
        thread = threading.Thread(target=server.generate, args=(input_ids, body, streamer, cancel, result), daemon=True)
        thread.start()
        rid = f"hf-{uuid.uuid4().hex[:12]}"
        pieces = _pieces(streamer)
        if not body.get("stream"):
            text = "".join([p async for p in pieces])
            await _joined(thread)  # generate() ends the streamer before it returns
            usage = {"prompt_tokens": int(input_ids.shape[1]), "completion_tokens": result.get("completion_tokens", 0)}
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if kind == "chat" else {"text": text})
            return JSONResponse({"id": rid, "object": "completion", "model": server.name, "choices": [choice], "usage": usage})

        async def events():
            try:
                async for piece in pieces:
                    if piece:
                        yield _event(kind, rid, server.name, piece, None, None)
                await _joined(thread)  # generate() ends the streamer before it returns
                if "error" in result:
                    yield f"data: {json.dumps({'error': {'message': result['error']}})}\n\n"
                    return
                yield _event(kind, rid, server.name, None, "length", None)
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"prompt_tokens": int(input_ids.shape[1]), "completion_tokens": result.get("completion_tokens", 0)}
                    yield _event(kind, rid, server.name, None, None, usage)
                yield "data: [DONE]\n\n"
            finally:
                cancel.set()

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", complete, methods=["POST"]),
                             Route("/v1/chat/completions", complete, methods=["POST"])])


async def _pieces(streamer: TextIteratorStreamer):
    """TextIteratorStreamer is a blocking iterator; read it off the event loop.

    Each request reads its streamer on a thread of its own. (Reading it through the loop's
    default executor deadlocked under load: that pool has cpu_count + 4 = 6 threads here, and
    requests queued behind the generate() lock each parked a thread in a blocking next() on
    their own, still empty, streamer; once six were waiting, the running request's reads
    could not get a thread, and its stream stopped mid-answer.)
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    def pump() -> None:
        try:
            for piece in streamer:
                loop.call_soon_threadsafe(queue.put_nowait, piece)
        except RuntimeError:  # the loop is closed: the server is stopping
            return
        finally:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, done)
            except RuntimeError:
                pass

    threading.Thread(target=pump, name="hf-stream-reader", daemon=True).start()
    while True:
        piece = await queue.get()
        if piece is done:
            return
        yield piece


async def _joined(thread: threading.Thread) -> None:
    """Wait for a generate() thread without taking an executor thread (see _pieces)."""
    while thread.is_alive():
        await asyncio.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--model", default=None, help="HF model folder (default: vllm-fleet's default model)")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from vllm_fleet.models import resolve_model

    resolved = resolve_model(args.model)
    server = HfServer(resolved.path, args.served_model_name or resolved.served_name, getattr(torch, args.dtype))
    uvicorn.run(build_app(server), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
