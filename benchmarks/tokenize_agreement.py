"""Do the router's prompt token ids equal the worker's? And what do they cost the router?

Builds a corpus of chat and completion requests (system prompts, multi-turn, tools and tool
calls in history, developer messages, text parts, non-ASCII, long documents, template
arguments, completions as text and ids) and renders each twice:

- worker: the worker's own path, in process, without an engine: `build_vllm_request` (vLLM's
  request model and validators) then `VllmRenderer.render` (worker/openai/render.py) over vLLM's
  HfRenderer built from the model's config (`renderer_from_config`), exactly what
  `AsyncLLM.renderer` is in a running worker;
- router: `PromptTokenizer.request_ids` (router/prompt/tokenizers.py) loaded from the files the
  worker's TokenizerFiles would send (`read_tokenizer_files`).

Two templates: the default model's (SmolLM2: plain ChatML, "string" content) and a tool-use
ChatML template that loops over content parts ("openai" content), prints tools and tool calls
with `tojson` and takes `enable_thinking`, on the same tokenizer. Prints % identical, each
mismatch's first differing position, and the router's CPU time per request (thread time).

    PYTHONPATH=src python benchmarks/tokenize_agreement.py [--seed 0] [--chats 130] [--completions 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.models import resolve_model
from vllm_fleet.protocol.tokenizer_files import FileAssembler
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RequestBody
from vllm_fleet.router.prompt.chat_render import Unrenderable
from vllm_fleet.router.prompt.tokenizers import PromptTokenizer

TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{% for part in messages[0].content %}{{ part.text }}{% endfor %}{% else %}You are a helpful assistant.{% endif %}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and tools and loop.first %}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% for part in message.content %}{{ part.text }}{% endfor %}
{%- for tc in message.tool_calls %}
<tool_call>
{{ tc.function | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response name="{{ message.name | default('') }}">
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>
{% endif %}{% for part in message.content %}{{ part.text }}{% endfor %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""

WORDS = ("the river runs north through the green city while models of light count tokens "
         "über naïve café crème brûlée São Paulo Ελληνικά русский текст 数据 流 北京 上海 人工智能 "
         "모델 日本語のテキスト 😀 🚀 👩‍💻 🇫🇷 العربية हिन्दी e\u0301 ﬁ \t tabs  double  spaces").split(" ")
SYSTEMS = ["You are a helpful assistant.", "Réponds en français, s'il te plaît.", "你是一个乐于助人的助手。",
           "Answer with JSON only. 🚀", "", "You are a careful reviewer.\nThink step by step.\n\n"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "q": {"type": "string", "description": "查询"}}}, "strict": True}},
    {"type": "function", "function": {"name": "noop"}},
]


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def document(rng: random.Random, tokens: int) -> str:
    paragraphs = [text(rng, 60) + "." for _ in range(max(1, tokens // 180))]  # ~180 tokens each
    return "Document:\n\n" + "\n\n".join(paragraphs)


def chat_request(rng: random.Random, i: int) -> dict:
    """One chat request body plus its messages (the body holds the other fields)."""
    messages: list[dict] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
    body: dict = {"model": "m", "max_tokens": 16}
    with_tools = rng.random() < 0.4
    if with_tools:
        body["tools"] = rng.sample(TOOLS, rng.randint(1, 3))
    for turn in range(rng.randint(1, 5)):
        user: dict = {"role": "user", "content": text(rng, rng.randint(1, 40))}
        if rng.random() < 0.2:
            user["content"] = [{"type": "text", "text": text(rng, 8)}, {"type": "text", "text": text(rng, 5)}]
        if rng.random() < 0.05:
            user["name"] = "alice"
        if i % 17 == 0 and turn == 0:
            user["content"] = document(rng, 2000 if i % 34 == 0 else 600) + "\n\nSummarise it."
        messages.append(user)
        if rng.random() < 0.05:
            messages.append({"role": "developer", "content": "Be brief. " + text(rng, 4)})
        if with_tools and rng.random() < 0.5:
            args = rng.choice(['{"city": "Zürich", "unit": "c"}', '{"q": "北京 天气 😀"}', "", "not json", "[1, 2]",
                               '{"nested": {"a": [1, 2, {"b": null}]}, "z": true}'])
            call = {"id": f"call_{i}_{turn}", "type": "function",
                    "function": {"name": rng.choice(["get_weather", "search"]), "arguments": args}}
            messages.append({"role": "assistant", "content": rng.choice([None, "", "Let me check."]),
                             "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"],
                             "content": rng.choice([json.dumps({"temp": 21.5, "desc": "ensoleillé ☀️"},
                                                               ensure_ascii=False), "42",
                                                    [{"type": "text", "text": "part one"},
                                                     {"type": "text", "text": "part two"}]])})
            messages.append({"role": "assistant", "content": text(rng, 10)})
        elif turn < 4 and rng.random() < 0.7:
            answer: dict = {"role": "assistant", "content": text(rng, rng.randint(1, 30))}
            if rng.random() < 0.1:
                answer["reasoning"] = "hmm " + text(rng, 5)
            messages.append(answer)
    if messages[-1]["role"] != "user" and rng.random() < 0.5:
        messages.append({"role": "user", "content": "And <|im_start|> then? " + text(rng, 3)})
    if rng.random() < 0.1:
        body["chat_template_kwargs"] = {"enable_thinking": False, "unused_option": 1}
    if rng.random() < 0.05:
        body["reasoning_effort"] = "none"
    if rng.random() < 0.05 and messages[-1]["role"] == "assistant":
        body.update(add_generation_prompt=False, continue_final_message=True)
    if rng.random() < 0.05:
        body["add_special_tokens"] = True
    return {"body": body, "messages": messages}


def edge_cases() -> list[dict]:
    """Chat requests on the edges of vLLM's conversation building, one decision each."""
    m = {"model": "m", "max_tokens": 16}
    user = {"role": "user", "content": "Bonjour 😀"}
    call = {"type": "function", "id": "c9", "function": {"name": "search", "arguments": '{"q": "ü"}'}, "extra": 1}
    return [
        {"body": m, "messages": [{"role": "system", "content": "x-anthropic-billing-header: cch=1\nReal system."}, user]},
        {"body": m, "messages": [{"role": "system", "content": "x-anthropic-billing-header: cch=2"}, user]},
        {"body": m, "messages": [{"role": "developer", "content": "Dev rules."}, user]},
        {"body": m, "messages": [{"role": "system", "content": "Sys."}, user, {"role": "developer", "content": "Later."},
                                 {"role": "user", "content": "again"}]},
        {"body": m, "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"t": 1}},
                                                              {"type": "input_text", "text": "b"},
                                                              {"type": "refusal", "refusal": "no"},
                                                              {"type": "text", "text": None}]}]},
        {"body": m, "messages": [user, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
                                                                         {"type": "output_text", "text": "ok"}]}, user]},
        {"body": m, "messages": [user, {"role": "assistant", "content": "x", "tool_calls": []}, user]},
        {"body": {**m, "tools": [TOOLS[1]]}, "messages": [user, {"role": "assistant", "content": None,
                                                                 "tool_calls": [call]},
                                                         {"role": "tool", "tool_call_id": "c9", "content": [
                                                             {"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]}]},
        {"body": {**m, "tools": [{**TOOLS[0], "defer_loading": True}]}, "messages": [user]},
        {"body": {**m, "chat_template_kwargs": {"enable_thinking": "auto", "custom": None}}, "messages": [user]},
        {"body": {**m, "reasoning_effort": "low"}, "messages": [user]},
        {"body": {**m, "documents": [{"title": "t", "text": "doc"}]}, "messages": [user]},
        {"body": {**m, "add_generation_prompt": False, "continue_final_message": True},
         "messages": [user, {"role": "assistant", "content": "Je commence"}]},
        {"body": {**m, "add_generation_prompt": False}, "messages": [user]},
        {"body": {**m, "add_generation_prompt": True, "continue_final_message": True},
         "messages": [user, {"role": "assistant", "content": "both set"}]},
        {"body": m, "messages": [{"role": "user", "content": ""}]},
        {"body": m, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
    ]


def completion_request(rng: random.Random, i: int) -> dict:
    body = {"model": "m", "max_tokens": 16}
    if i % 10 == 9:
        return {"body": body, "prompt": [rng.randrange(1, 49000) for _ in range(rng.randint(1, 50))]}
    prompt = rng.choice(["", " ", "  leading spaces", "trailing\n\n", "<|im_start|>user\nhi<|im_end|>"]) \
        if i % 7 == 0 else text(rng, rng.randint(1, 200))
    if i % 13 == 0:
        prompt = document(rng, 2000)
    if i % 11 == 0:
        body["add_special_tokens"] = False
    return {"body": body, "prompt": prompt}


def vllm_renderer(folder: Path):
    """The worker's renderer without an engine: vLLM's HfRenderer for the model's config."""
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers import renderer_from_config

    from vllm_fleet.worker.openai.render import VllmRenderer

    config = VllmConfig(model_config=ModelConfig(model=str(folder), tokenizer=str(folder)))
    renderer = renderer_from_config(config)
    return VllmRenderer(SimpleNamespace(renderer=renderer, vllm_config=config), renderer.get_tokenizer())


async def worker_ids(renderer, case: dict) -> list[int] | str:
    from vllm_fleet.worker.openai.request import build_vllm_request

    endpoint = "chat" if "messages" in case else "completion"
    item = GenerateInput(messages=case.get("messages")) if endpoint == "chat" else \
        GenerateInput(text=case["prompt"]) if isinstance(case["prompt"], str) else GenerateInput(token_ids=case["prompt"])
    request = GenerateRequest("r", [item], RequestBody(endpoint, json.dumps(case["body"]).encode()))
    try:
        return (await renderer.render(build_vllm_request(request, item))).token_ids
    except InvalidRequestError as exc:
        return f"refused: {exc}"


def router_ids(tokenizer: PromptTokenizer, case: dict) -> tuple[list[int] | str, float]:
    started = time.thread_time()
    try:
        ids: list[int] | str = tokenizer.request_ids(case["body"], messages=case.get("messages"),
                                                     prompt=case.get("prompt"))
    except Unrenderable as exc:
        ids = f"unrenderable: {exc}"
    return ids, time.thread_time() - started


def served_files(source: Path, dest: Path) -> Path:
    """The folder a router gets: what TokenizerFiles sends for `source`, written by FileAssembler."""
    from vllm_fleet.worker.tokenizer_files import read_tokenizer_files

    files = FileAssembler(dest)
    for name, data, last in read_tokenizer_files(SimpleNamespace(tokenizer_source=str(source))):
        files.add(name, data, last)
    files.finish()
    return dest


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(label: str, renderer, tokenizer: PromptTokenizer, cases: list[dict]) -> tuple[int, int, list[float]]:
    same, refused, times = 0, 0, []
    first = router_ids(tokenizer, cases[0])[1]  # this thread's tokenizer copy, the template compiled
    print(f"{label}: first call {first * 1e3:.1f} ms (not counted below)")
    for index, case in enumerate(cases):
        expected = asyncio.run(worker_ids(renderer, case))
        got, seconds = router_ids(tokenizer, case)
        times.append(seconds)
        if got == expected or (isinstance(expected, str) and isinstance(got, str)):
            same += 1  # equal ids, or both refuse (the router then routes without ids)
            refused += isinstance(expected, str)
            continue
        where = first_difference(got, expected) if isinstance(got, list) and isinstance(expected, list) else None
        print(f"MISMATCH {label} #{index}: first differing position {where}; "
              f"router {str(got)[:160]} | worker {str(expected)[:160]}")
        print(f"  case: {json.dumps(case, ensure_ascii=False)[:400]}")
    print(f"{label}: {refused} of the identical answers are refusals on both sides")
    return same, len(cases), times


def describe(times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"mean {statistics.mean(times) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms, max {ordered[-1] * 1e3:.3f} ms (n={len(times)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chats", type=int, default=130)
    parser.add_argument("--completions", type=int, default=60)
    args = parser.parse_args()
    import transformers
    import vllm

    logging.getLogger("vllm").setLevel(logging.ERROR)  # it warns at each malformed tool call in history

    rng = random.Random(args.seed)
    chats = [chat_request(rng, i) for i in range(args.chats)] + edge_cases()
    completions = [completion_request(rng, i) for i in range(args.completions)]
    model = Path(resolve_model(None, None).path)
    print(f"vllm {vllm.__version__}, transformers {transformers.__version__}, model folder {Path(model).name} (the packaged default model, in the vllm-fleet cache)")
    with tempfile.TemporaryDirectory() as tmp:
        tools_model = Path(tmp, "tools-model")
        tools_model.mkdir()
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(model / name, tools_model / name)
        (tools_model / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
        totals = [0, 0]
        all_times: list[float] = []
        for label, folder, cases in (("default", model, chats + completions), ("tool-template", tools_model, chats)):
            tokenizer = PromptTokenizer.load(served_files(folder, Path(tmp, label + "-router")))
            same, count, times = compare(label, vllm_renderer(folder), tokenizer, cases)
            totals[0] += same
            totals[1] += count
            all_times += times
            print(f"{label}: {same}/{count} identical ({100 * same / count:.2f} %); router CPU per request: "
                  f"{describe(times)}")
        print(f"ALL: {totals[0]}/{totals[1]} identical ({100 * totals[0] / totals[1]:.2f} %); router CPU per "
              f"request: {describe(all_times)}")
        long_chat = {"body": {"model": "m", "tools": TOOLS[:2]},
                     "messages": [{"role": "system", "content": SYSTEMS[0]},
                                  {"role": "user", "content": document(random.Random(1), 1900)},
                                  {"role": "assistant", "content": "Noted."},
                                  {"role": "user", "content": "Résume-le en 3 points 😀"}]}
        for label, folder in (("default", model), ("tool-template", tools_model)):
            tokenizer = PromptTokenizer.load(Path(tmp, label + "-router"))
            ids = tokenizer.request_ids(long_chat["body"], messages=long_chat["messages"])
            times = [router_ids(tokenizer, long_chat)[1] for _ in range(300)]
            print(f"long chat ({len(ids)} tokens, {label}): {describe(times)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
