"""The fault and feature suite on a GPU node (issue #28, item 1), as a user would run it.

One `vllm-fleet node --fleet-file` starts every worker (two models sharing the GPU(s), a pool
each), one gateway fronts them, and real HTTP clients drive each scenario through the gateway:

  kill     64 streams of the `--stream-model`; once each has its first token, kill -9 one worker
           (its whole process tree, as a container dies). Every stream must end with [DONE], no
           error event, and exactly max_tokens tokens as the client counted them (a lost token
           makes fewer, a repeated one more; with `--word-tokens` the model's tokenizer is
           word-level, so the client counts the words it received as well as the usage).
  lora     POST /v1/load_lora_adapter, requests naming the adapter, greedy text differs from the
           base model's, unload while adapter streams run: none of them fails.
  tools    tool_choice required and named (and auto with the worker's parser), and a
           json_schema response_format, on the `--tools-model` (real weights): every answer ends by
           itself (no ignore_eos) and validates against its schema.
  hang     SIGSTOP of the EngineCore (and its children) of one `--stream-model` worker, with
           long streams running and new requests arriving at `--arrival-rate`: the time until the
           worker says NOT_SERVING (or is gone), failed streams (0), and every new request answered.
  fleet    both models listed by /v1/models, each worker's pool, and the GPU memory each took.
  surface  the rest of `vllm serve`'s surface through the gateway on this vLLM release (#27):
           Responses (plain, streamed, a required tool call), Messages (plain, streamed,
           count_tokens), /tokenize + /detokenize, the chat render route, /version, and a
           completion with echo + logprobs; each answers in its API's shape.
  spark    a Spark job (`generate`, local mode, straight to the `--tools-model` workers over gRPC,
           no gateway) answers `--spark-rows` rows twice: unbroken, then with one worker killed
           (kill -9 of its tree) while it holds rows. Rows in = rows out, one per id, 0 row
           errors, every answer `--spark-tokens` tokens long, rows moved to the survivor.

Each scenario prints `[figure] ...` lines and `[check] name: ok|FAILED ...` lines; the exit
status is the number of failed checks. The whole run's report goes to OUT/suite.json.

    python benchmarks/gpu/suite.py --fleet-file F --stream-model qwen3.5-9b --tools-model smol \\
        --adapter DIR --out OUT [--word-tokens] [--scenarios fleet,kill,tools,lora,surface,spark,hang]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from vllm_fleet.client import WorkerClient  # noqa: E402
from vllm_fleet.fleet.fleet_file import load_fleet_file  # noqa: E402

REPORT: dict = {"checks": {}, "figures": {}}


def check(name: str, ok: bool, detail: str = "") -> bool:
    REPORT["checks"][name] = {"ok": bool(ok), "detail": detail}
    print(f"[check] {name}: {'ok' if ok else 'FAILED'} {detail}".rstrip(), flush=True)
    return ok


def figure(name: str, value: object) -> None:
    REPORT["figures"][name] = value
    print(f"[figure] {name}: {value}", flush=True)


# ---------------------------------------------------------------------------------------------
# Processes


@dataclass
class Stack:
    python: list[str]
    fleet_file: Path
    out: Path
    gateway_port: int
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.out / "logs" / f"{name}.log", "ab")
        process = subprocess.Popen([*self.python, *argv], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=ROOT)
        self.processes.append(process)
        return process

    def start_node(self) -> subprocess.Popen:
        return self._start("node", ["-m", "vllm_fleet.cli", "node", "--fleet-file", str(self.fleet_file),
                                    "--log-dir", str(self.out / "logs" / "node"), "--startup-timeout-s", "600"])

    def start_gateway(self, workers: list[str]) -> subprocess.Popen:
        return self._start("gateway", ["-m", "vllm_fleet.cli", "gateway", "--workers", ",".join(workers),
                                       "--port", str(self.gateway_port), "--no-access-log"])

    def stop(self) -> None:
        for process in reversed(self.processes):
            with _quiet():
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        for process in reversed(self.processes):
            with _quiet():
                process.wait(timeout=max(1, deadline - time.monotonic()))
            with _quiet():
                os.killpg(process.pid, signal.SIGKILL)


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


def worker_process(port: int) -> psutil.Process | None:
    """The `vllm-fleet worker` process listening on `port` (started by the node)."""
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "worker" in cmdline and "--port" in cmdline and cmdline[cmdline.index("--port") + 1] == str(port):
            return process
    return None


async def wait_serving(addresses: list[str], timeout: float) -> float:
    started = time.monotonic()
    for address in addresses:
        async with WorkerClient(address) as client:
            await client.wait_serving(timeout=max(1.0, timeout - (time.monotonic() - started)))
    return time.monotonic() - started


async def health(address: str) -> str:
    try:
        async with WorkerClient(address) as client:
            return await client.health(timeout=1.0)
    except Exception as exc:  # noqa: BLE001 - a worker that is gone answers nothing
        return f"unreachable ({type(exc).__name__})"


# ---------------------------------------------------------------------------------------------
# HTTP


@dataclass
class StreamResult:
    status: int = 0
    text: str = ""
    done: bool = False
    error: str | None = None
    finish: str | None = None
    completion_tokens: int | None = None
    first_token_at: float | None = None


async def stream_completion(http: aiohttp.ClientSession, url: str, body: dict, first: asyncio.Event | None = None,
                            path: str = "/v1/completions") -> StreamResult:
    result = StreamResult()
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with http.post(url + path, json=body) as reply:
            result.status = reply.status
            if reply.status != 200:
                result.error = (await reply.text())[:300]
                return result
            async for raw in reply.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    result.done = True
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    result.error = json.dumps(event["error"])[:300]
                for choice in event.get("choices", []):
                    piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    if piece and result.first_token_at is None:
                        result.first_token_at = time.monotonic()
                        if first is not None:
                            first.set()
                    result.text += piece
                    result.finish = choice.get("finish_reason") or result.finish
                if event.get("usage"):
                    result.completion_tokens = event["usage"]["completion_tokens"]
    except Exception as exc:  # noqa: BLE001 - reported as this stream's failure
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result


def word_prompt(rng: random.Random, words: int) -> str:
    # Word-level stand-in tokenizer: token i is "t<i>", one token per word.
    return " ".join(f"t{rng.randrange(1000, 50000)}" for _ in range(words))


async def metric_sum(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as reply:
        text = await reply.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if not line.startswith("#") and line.split("{")[0].split(" ")[0].endswith(name))


# ---------------------------------------------------------------------------------------------
# Scenarios


async def scenario_kill(args, stack: Stack, http: aiohttp.ClientSession, victim_port: int) -> None:
    rng = random.Random(0)
    tokens = args.kill_tokens
    bodies = [{"model": args.stream_model, "prompt": word_prompt(rng, 64) if args.word_tokens
               else f"Story {i}: once upon a time", "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
              for i in range(args.streams)]
    migrations_before = await metric_sum(http, stack.url, "migrations_total")
    firsts = [asyncio.Event() for _ in bodies]
    tasks = [asyncio.create_task(stream_completion(http, stack.url, body, event)) for body, event in zip(bodies, firsts)]
    await _wait(lambda: all(e.is_set() for e in firsts) or any(t.done() for t in tasks), 300, "every first token")
    check("kill: streams running at the kill", not any(t.done() for t in tasks), "make --kill-tokens larger" if any(
        t.done() for t in tasks) else "")
    killed_at = time.monotonic()
    figure("kill: processes killed (worker + engine)", kill_tree(victim_port))
    results = await asyncio.gather(*tasks)
    failed = [r for r in results if not (r.status == 200 and r.done and r.error is None and r.finish == "length")]
    counted = [r.completion_tokens for r in results]
    words = [len(r.text.split()) for r in results]
    migrations = await metric_sum(http, stack.url, "migrations_total") - migrations_before
    figure("kill: streams", len(results))
    figure("kill: failed streams", len(failed))
    figure("kill: streams migrated (gateway counter)", migrations)
    figure("kill: last stream ended s after the kill", round(time.monotonic() - killed_at, 2))
    check("kill: 0 failed streams", not failed, "; ".join(f"{r.status} {r.error}" for r in failed[:3]))
    check("kill: some streams migrated", migrations > 0, f"{migrations:g}")
    check("kill: every stream has max_tokens tokens (usage)", all(c == tokens for c in counted),
          f"counts {sorted(set(counted))}")
    if args.word_tokens:
        check("kill: every client received max_tokens tokens (its own count)", all(w == tokens for w in words),
              f"counts {sorted(set(words))}")
    REPORT["kill_victim_port"] = victim_port


async def scenario_lora(args, stack: Stack, http: aiohttp.ClientSession) -> None:
    if not args.adapter:
        check("lora: adapter folder given", False, "pass --adapter")
        return
    url = stack.url
    bad = await (await http.post(url + "/v1/load_lora_adapter",
                                 json={"lora_name": "bad", "lora_path": args.adapter + "-missing",
                                       "base_model_name": args.tools_model})).json()
    check("lora: a bad folder is refused naming lora_path", bad.get("error", {}).get("param") == "lora_path",
          json.dumps(bad)[:200])
    started = time.monotonic()
    async with http.post(url + "/v1/load_lora_adapter", json={"lora_name": "tuned", "lora_path": args.adapter,
                                                              "base_model_name": args.tools_model}) as reply:
        loaded = reply.status, await reply.text()
    figure("lora: load through the admin endpoint s", round(time.monotonic() - started, 2))
    check("lora: loaded", loaded[0] == 200 and "Success" in loaded[1], str(loaded)[:200])

    async def complete(model: str) -> dict:
        async with http.post(url + "/v1/completions", json={"model": model, "prompt": "The capital of France is",
                                                            "max_tokens": 12, "temperature": 0}) as reply:
            return {"status": reply.status, **(await reply.json())}

    burst = await asyncio.gather(*(complete("tuned") for _ in range(32)))
    check("lora: 32 requests naming the adapter answered", all(r["status"] == 200 for r in burst))
    base, tuned = (await complete(args.tools_model)), (await complete("tuned"))
    base_text, tuned_text = base["choices"][0]["text"], tuned["choices"][0]["text"]
    figure("lora: greedy base vs adapter", f"{base_text!r} vs {tuned_text!r}")
    check("lora: the adapter changes the greedy answer", base_text != tuned_text)
    firsts = [asyncio.Event() for _ in range(8)]
    running = [asyncio.create_task(stream_completion(
        http, url, {"model": "tuned", "prompt": "Tell me a long story.", "max_tokens": 256, "temperature": 0},
        event)) for event in firsts]
    await _wait(lambda: all(e.is_set() for e in firsts) or any(t.done() for t in running), 120, "adapter streams")
    async with http.post(url + "/v1/unload_lora_adapter", json={"lora_name": "tuned"}) as reply:
        unloaded = reply.status
    results = await asyncio.gather(*running)
    check("lora: unload under traffic answered 200", unloaded == 200, str(unloaded))
    check("lora: 0 adapter streams failed across the unload",
          all(r.status == 200 and r.done and r.error is None for r in results),
          "; ".join(str(r.error) for r in results if r.error)[:300])
    after = await complete("tuned")
    check("lora: the adapter is gone after the unload (404)", after["status"] == 404, str(after["status"]))


# strict: OpenAI's (and vLLM's) promise that arguments follow the schema; without it a tool
# parser's grammar guarantees only JSON (vLLM 0.32's hermes structural tag takes any value).
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city", "strict": True,
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time in a city", "strict": True,
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


async def scenario_tools(args, stack: Stack, http: aiohttp.ClientSession) -> None:
    import jsonschema

    messages = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]

    async def chat(**extra) -> dict:
        body = {"model": args.tools_model, "messages": messages, "max_tokens": 200, "temperature": 0, **extra}
        async with http.post(stack.url + "/v1/chat/completions", json=body) as reply:
            return {"status": reply.status, **(await reply.json())}

    for label, choice, name in (("required", "required", None),
                                ("named", {"type": "function", "function": {"name": "get_weather"}}, "get_weather")):
        answer = await chat(tools=TOOLS, tool_choice=choice)
        ok, detail = answer["status"] == 200, ""
        if ok:
            message = answer["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            ok = bool(calls) and answer["choices"][0]["finish_reason"] in ("tool_calls", "stop")
            for call in calls:
                try:
                    arguments = json.loads(call["function"]["arguments"])
                    schema = next(t["function"]["parameters"] for t in TOOLS
                                  if t["function"]["name"] == call["function"]["name"])
                    jsonschema.validate(arguments, schema)
                except Exception as exc:  # noqa: BLE001 - reported
                    ok, detail = False, f"{type(exc).__name__}: {exc}"[:200]
                ok = ok and (name is None or call["function"]["name"] == name)
            detail = detail or json.dumps(calls)[:200]
        figure(f"tools: tool_choice {label}", detail or answer.get("error"))
        check(f"tools: tool_choice {label} gives valid tool calls that end by themselves", ok, detail)
    auto = await chat(tools=TOOLS, tool_choice="auto")
    # Whether a model calls a tool on its own is the model's business (random weights never do);
    # what the fleet owes is the parser's answer: content or well-formed tool calls, a finish reason.
    auto_ok = auto["status"] == 200 and auto["choices"][0]["finish_reason"] in ("stop", "tool_calls", "length")
    if auto_ok:
        message = auto["choices"][0]["message"]
        auto_ok = isinstance(message.get("content"), str) or bool(message.get("tool_calls"))
    figure("tools: tool_choice auto (hermes parser on the worker)",
           f"finish {auto['choices'][0]['finish_reason'] if auto['status'] == 200 else auto['status']}: "
           + json.dumps(auto["choices"][0]["message"] if auto["status"] == 200 else auto)[:240])
    check("tools: tool_choice auto with the parser answers content or tool calls", auto_ok)
    schema = {"type": "object", "additionalProperties": False, "required": ["capital", "population_millions"],
              "properties": {"capital": {"type": "string", "maxLength": 30},
                             "population_millions": {"type": "number", "minimum": 0, "maximum": 100}}}
    answer = await chat(response_format={"type": "json_schema",
                                         "json_schema": {"name": "city", "schema": schema, "strict": True}})
    ok, detail = answer["status"] == 200, ""
    if ok:
        try:
            content = answer["choices"][0]["message"]["content"]
            jsonschema.validate(json.loads(content), schema)
            detail = content[:200]
            ok = answer["choices"][0]["finish_reason"] == "stop"
        except Exception as exc:  # noqa: BLE001 - reported
            ok, detail = False, f"{type(exc).__name__}: {exc}"[:200]
    figure("tools: json_schema answer", detail)
    check("tools: json_schema answer validates and ends by itself", ok, detail)


async def scenario_surface(args, stack: Stack, http: aiohttp.ClientSession) -> None:
    model, url = args.tools_model, stack.url

    async def post(path: str, body: dict) -> tuple[int, dict | str]:
        async with http.post(url + path, json=body) as reply:
            text = await reply.text()
            try:
                return reply.status, json.loads(text)
            except ValueError:
                return reply.status, text

    async def events(path: str, body: dict) -> tuple[int, list[str], str]:
        """SSE: (status, each data event's `type`, the whole text)."""
        async with http.post(url + path, json=body) as reply:
            text = await reply.text()
        names = []
        for line in text.splitlines():
            if line.startswith("data: ") and line[6:].strip() not in ("[DONE]", ""):
                with _quiet():
                    names.append(json.loads(line[6:]).get("type", ""))
        return reply.status, names, text

    question = "What is the capital of France?"
    status, answer = await post("/v1/responses", {"model": model, "input": question, "max_output_tokens": 24})
    text = ""
    if status == 200:
        text = "".join(part.get("text", "") for item in answer.get("output", []) if item.get("type") == "message"
                       for part in item.get("content", []))
    figure("surface: responses text", text[:120] or str(answer)[:200])
    check("surface: /v1/responses answers a response with output text",
          status == 200 and answer.get("object") == "response" and bool(text.strip()), str(status))
    status, names, raw = await events("/v1/responses", {"model": model, "input": question, "max_output_tokens": 24,
                                                          "stream": True})
    check("surface: /v1/responses streamed: created, text deltas, completed",
          status == 200 and names[:1] == ["response.created"] and "response.output_text.delta" in names
          and names[-1] == "response.completed", f"{status} {names[:3]}...{names[-2:]}")
    status, answer = await post("/v1/responses", {
        "model": model, "input": "What will the weather be in Paris for the next 3 days?", "max_output_tokens": 200,
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather forecast for a city",
                   "parameters": WEATHER, "strict": True}], "tool_choice": "required"})
    calls = [item for item in (answer.get("output", []) if status == 200 else []) if item.get("type") == "function_call"]
    ok, detail = bool(calls), str(answer)[:200]
    for call in calls:
        try:
            import jsonschema

            jsonschema.validate(json.loads(call["arguments"]), WEATHER)
            detail = f"{call['name']}({call['arguments']})"
        except Exception as exc:  # noqa: BLE001 - reported
            ok, detail = False, f"{type(exc).__name__}: {exc}"[:200]
    check("surface: /v1/responses tool_choice required gives a valid function_call", ok, detail)

    status, answer = await post("/v1/messages", {"model": model, "max_tokens": 24,
                                                 "messages": [{"role": "user", "content": question}]})
    text = "".join(b.get("text", "") for b in answer.get("content", [])) if status == 200 else ""
    figure("surface: messages text", text[:120] or str(answer)[:200])
    check("surface: /v1/messages answers a message", status == 200 and answer.get("type") == "message"
          and bool(text.strip()) and answer.get("usage", {}).get("output_tokens", 0) > 0, str(status))
    status, names, _ = await events("/v1/messages", {"model": model, "max_tokens": 24, "stream": True,
                                                      "messages": [{"role": "user", "content": question}]})
    check("surface: /v1/messages streamed: message_start, deltas, message_stop",
          status == 200 and names[:1] == ["message_start"] and "content_block_delta" in names
          and names[-1] == "message_stop", f"{status} {names[:2]}...{names[-2:]}")
    status, counted = await post("/v1/messages/count_tokens", {"model": model,
                                                               "messages": [{"role": "user", "content": question}]})
    check("surface: /v1/messages/count_tokens counts", status == 200 and counted.get("input_tokens", 0) > 0,
          str(counted)[:120])

    status, tokens = await post("/tokenize", {"model": model, "prompt": "Hello, world"})
    ids = tokens.get("tokens", []) if status == 200 else []
    status2, text = await post("/detokenize", {"model": model, "tokens": ids})
    check("surface: /tokenize then /detokenize gives the text back",
          status == 200 and status2 == 200 and bool(ids) and "Hello, world" in text.get("prompt", ""),
          f"{ids} -> {text}"[:200])
    status, rendered = await post("/v1/chat/completions/render",
                                  {"model": model, "messages": [{"role": "user", "content": question}]})
    check("surface: /v1/chat/completions/render answers", status == 200, str(rendered)[:160])
    async with http.get(url + "/version") as reply:
        version = reply.status, await reply.text()
    figure("surface: /version", version[1][:120])
    check("surface: /version answers", version[0] == 200, str(version)[:120])
    prompt = "The capital of France is"
    status, answer = await post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4,
                                                    "echo": True, "logprobs": 1, "temperature": 0})
    ok = status == 200
    if ok:
        choice = answer["choices"][0]
        usage = answer.get("usage", {})
        ok = (choice["text"].startswith(prompt) and
              len(choice["logprobs"]["tokens"]) == usage.get("prompt_tokens", -1) + usage.get("completion_tokens", -1))
    check("surface: a completion with echo + logprobs: the prompt's tokens lead, one logprob entry per token", ok,
          str(answer)[:200])


def kill_tree(port: int) -> int:
    """kill -9 the worker on `port` and its children (as a container dies); how many processes."""
    victim = worker_process(port)
    tree = [victim, *victim.children(recursive=True)] if victim else []
    for process in tree:
        with _quiet():
            process.send_signal(signal.SIGKILL)
    return len(tree)


def spark_session(cores: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(f"local[{cores}]").config("spark.driver.memory", "4g")
               .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


async def scenario_spark(args, stack: Stack, ports: list[int]) -> None:
    try:
        session = spark_session(args.spark_cores)
    except Exception as exc:  # noqa: BLE001 - reported: no Java or no pyspark on this machine
        check("spark: a Spark session starts", False, f"{type(exc).__name__}: {exc}"[:300])
        return
    from vllm_fleet.spark import generate

    addresses = [f"127.0.0.1:{port}" for port in ports]
    params = {"max_tokens": args.spark_tokens, "temperature": 0, "ignore_eos": True}
    figure("spark: version, cores, rows", f"{session.version}, local[{args.spark_cores}], {args.spark_rows}")

    def job(salt: str) -> tuple[float, list]:
        rows = [(i, f"{salt} question {i}: name a colour, a fruit and a city.") for i in range(args.spark_rows)]
        df = session.createDataFrame(rows, "id long, prompt string").repartition(args.spark_cores).cache()
        df.count()
        started = time.perf_counter()
        out = generate(df, prompt_col="prompt", id_col="id", params=params, model=args.tools_model,
                       workers=addresses, max_in_flight=args.spark_in_flight).collect()
        return time.perf_counter() - started, out

    def report(label: str, seconds: float, rows: list) -> bool:
        ids = {r.id for r in rows}
        errors = [r for r in rows if r.error is not None]
        short = [r for r in rows if r.error is None and r.completion_tokens != args.spark_tokens]
        figure(f"spark: {label} rows/s", round(len(rows) / seconds, 1))
        figure(f"spark: {label} rows in / out / distinct ids / row errors",
               f"{args.spark_rows} / {len(rows)} / {len(ids)} / {len(errors)}")
        ok = len(rows) == args.spark_rows and ids == set(range(args.spark_rows)) and not errors and not short
        check(f"spark: {label}: rows in = rows out, one per id, 0 row errors, every answer "
              f"{args.spark_tokens} tokens", ok,
              "; ".join(f"{r.id}: {r.error}" for r in errors[:3]) or (f"{len(short)} short answers" if short else ""))
        return ok

    await asyncio.to_thread(job, "warm-up")  # the JVM, Python workers and their Routers
    seconds, rows = await asyncio.to_thread(job, "unbroken")
    report("unbroken", seconds, rows)
    running = asyncio.create_task(asyncio.to_thread(job, "killed"))
    victim = addresses[0]
    async with WorkerClient(victim) as client:
        async def holds_rows() -> bool:
            with _quiet():
                load = await client.load(timeout=2)
                return load.running > 0
            return False
        deadline = time.monotonic() + max(60.0, seconds * 3)
        await asyncio.sleep(seconds * args.spark_kill_at)  # into the job, not a synchronisation
        while not await holds_rows() and not running.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    mid_job = not running.done()
    figure("spark: processes killed (worker + engine)", kill_tree(ports[0]))
    check("spark: the kill landed mid-job", mid_job, "" if mid_job else "the job ended first: raise --spark-rows")
    seconds, rows = await running
    if report("worker killed", seconds, rows):
        moved = sum(1 for r in rows if r.attempts > 1)
        figure("spark: rows answered after moving to the survivor (attempts > 1)", moved)
        figure("spark: rows per worker", dict(collections.Counter(r.worker for r in rows)))
        check("spark: rows in flight on the killed worker moved to the survivor", moved > 0, str(moved))
    session.stop()


async def scenario_hang(args, stack: Stack, http: aiohttp.ClientSession, victim_port: int) -> None:
    rng = random.Random(1)
    address = f"127.0.0.1:{victim_port}"
    prompt = (lambda: word_prompt(rng, 64)) if args.word_tokens else (lambda: "Tell me a long story.")
    firsts = [asyncio.Event() for _ in range(16)]
    streams = [asyncio.create_task(stream_completion(
        http, stack.url, {"model": args.stream_model, "prompt": prompt(), "max_tokens": args.hang_tokens,
                          "ignore_eos": True, "temperature": 0}, event)) for event in firsts]
    await _wait(lambda: all(e.is_set() for e in firsts) or any(t.done() for t in streams), 300, "hang: streams")
    victim = worker_process(victim_port)
    if victim is None:
        check("hang: victim worker found", False, str(victim_port))
        return
    engine = victim.children(recursive=True)
    figure("hang: processes stopped (EngineCore and its children)", [p.name() for p in engine])
    stopped_at = time.monotonic()
    for process in engine:
        with _quiet():
            process.send_signal(signal.SIGSTOP)
    arrivals: list[asyncio.Task] = []
    detected_at: float | None = None
    states: list[str] = []
    try:
        next_arrival = time.monotonic()
        while time.monotonic() - stopped_at < args.hang_limit_s:
            now = time.monotonic()
            while next_arrival <= now:
                arrivals.append(asyncio.create_task(stream_completion(
                    http, stack.url, {"model": args.stream_model, "prompt": prompt(), "max_tokens": 16,
                                      "temperature": 0})))
                next_arrival += rng.expovariate(args.arrival_rate)
            state = await health(address)
            states.append(state)
            if state != "SERVING":
                detected_at = time.monotonic()
                break
            await asyncio.sleep(0.1)  # the poll's pace, not a synchronisation
    finally:
        for process in engine:
            with _quiet():
                process.send_signal(signal.SIGCONT)
    detection = None if detected_at is None else round(detected_at - stopped_at, 2)
    figure("hang: detection s (SIGSTOP to NOT_SERVING or gone)", detection)
    figure("hang: worker state at detection", states[-1] if states else None)
    figure("hang: requests arriving during the stall", len(arrivals))
    check("hang: detected within 10 s", detection is not None and detection <= 10.0, str(detection))
    results = await asyncio.gather(*streams)
    answered = await asyncio.gather(*arrivals)
    failed = [r for r in results if not (r.status == 200 and r.done and r.error is None)]
    late = [r for r in answered if not (r.status == 200 and r.done and r.error is None)]
    figure("hang: failed streams", len(failed))
    figure("hang: arrivals not answered", len(late))
    check("hang: 0 failed streams", not failed, "; ".join(str(r.error) for r in failed[:3]))
    check("hang: every request arriving during the stall answered", not late, "; ".join(str(r.error)
                                                                                         for r in late[:3]))


async def scenario_fleet(args, stack: Stack, http: aiohttp.ClientSession, fleet) -> None:
    async with http.get(stack.url + "/v1/models") as reply:
        models = {card["id"] for card in (await reply.json())["data"]}
    want = {entry.name for entry in fleet.models}
    figure("fleet: models served", sorted(models))
    check("fleet: every model of the fleet file is served", want <= models, f"want {sorted(want)}")
    pools = {}
    for port in range(fleet.base_port, fleet.base_port + sum(e.replicas for e in fleet.models)):
        async with WorkerClient(f"127.0.0.1:{port}") as client:
            info = await client.info()
            pools[port] = {"model": info.model, "pool": info.pool, "device": info.device, "engine": info.engine_version}
    figure("fleet: workers", pools)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        smi = "no nvidia-smi"
    figure("fleet: GPU memory per process", smi.replace("\n", "; "))


async def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def main(args) -> int:
    fleet = load_fleet_file(args.fleet_file)
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    stack = Stack(python=args.python.split(), fleet_file=Path(args.fleet_file), out=out, gateway_port=args.port)
    ports, first = {}, fleet.base_port
    for entry in fleet.models:
        ports[entry.name] = list(range(first, first + entry.replicas))
        first += entry.replicas
    addresses = [f"127.0.0.1:{p}" for group in ports.values() for p in group]
    scenarios = args.scenarios.split(",")
    started = time.monotonic()
    try:
        stack.start_node()
        took = await wait_serving(addresses, args.start_timeout)
        figure("start: every worker serving s", round(took, 1))
        stack.start_gateway(addresses)
        timeout = aiohttp.ClientTimeout(total=900)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
            await _wait_http(http, stack.url, 120)
            stream_ports = ports[args.stream_model]
            if "fleet" in scenarios:
                await scenario_fleet(args, stack, http, fleet)
            if "kill" in scenarios:
                await scenario_kill(args, stack, http, stream_ports[0])
            if "tools" in scenarios:
                await scenario_tools(args, stack, http)
            if "lora" in scenarios:
                await scenario_lora(args, stack, http)
            if "surface" in scenarios:
                await scenario_surface(args, stack, http)
            if "spark" in scenarios:
                await scenario_spark(args, stack, ports[args.tools_model])
            if "hang" in scenarios:
                if "kill" in scenarios:  # the node restarts the killed worker; the hang needs both
                    back = time.monotonic()
                    await wait_serving([f"127.0.0.1:{stream_ports[0]}"], args.start_timeout)
                    figure("kill: the node had the killed worker serving again, s after the other scenarios",
                           round(time.monotonic() - back, 1))
                await scenario_hang(args, stack, http, stream_ports[-1])
    except Exception as exc:  # noqa: BLE001 - the report says where it stopped
        check("suite ran to its end", False, f"{type(exc).__name__}: {exc}")
    finally:
        stack.stop()
        figure("suite wall s", round(time.monotonic() - started, 1))
        (out / "suite.json").write_text(json.dumps(REPORT, indent=1, default=str))
    failed = [name for name, c in REPORT["checks"].items() if not c["ok"]]
    print(f"[summary] {len(REPORT['checks']) - len(failed)} checks passed, {len(failed)} failed: {failed}")
    return len(failed)


async def _wait_http(http: aiohttp.ClientSession, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with http.get(url + "/v1/models") as reply:
                if reply.status == 200 and (await reply.json())["data"]:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError("the gateway did not list a model")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fleet-file", required=True)
    parser.add_argument("--stream-model", required=True, help="served name of the model the kill and hang use")
    parser.add_argument("--tools-model", required=True, help="served name of the real-weights model (LoRA, tools)")
    parser.add_argument("--adapter", help="PEFT LoRA folder for the tools model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--scenarios", default="fleet,kill,tools,lora,hang")
    parser.add_argument("--word-tokens", action="store_true", help="the stream model's tokenizer is word-level")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--kill-tokens", type=int, default=512)
    parser.add_argument("--hang-tokens", type=int, default=512)
    parser.add_argument("--arrival-rate", type=float, default=10.0, help="new requests per second during the stall")
    parser.add_argument("--hang-limit-s", type=float, default=60.0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--spark-rows", type=int, default=4000)
    parser.add_argument("--spark-tokens", type=int, default=32)
    parser.add_argument("--spark-cores", type=int, default=8, help="Spark local[N]")
    parser.add_argument("--spark-in-flight", type=int, default=64, help="rows in flight per Spark task")
    parser.add_argument("--spark-kill-at", type=float, default=0.3, help="fraction of the unbroken job's time")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
