"""What the bench sends: workloads are endless, seeded streams of `BenchItem`s.

- `random`: prompts of a set input length, answers of a set output length. Each item carries
  random token ids (sent as-is to targets that accept token ids: workers over gRPC) and a text
  of about as many tokens (for HTTP targets that take text).
- `mix`: the reference production mix: 60 % single-turn questions, 30 % turns of multi-turn
  conversations (each conversation one session id, every turn carrying the history before it,
  so session affinity and prefix caching can pay off), 10 % summaries of a long text.
- `prefix`: prompts sharing one of a few long prefixes, each with its own suffix.
- `jsonl`: the user's own prompts, one JSON object per line
  (`{"prompt": "..."}` or `{"messages": [...]}`, optional `max_tokens`, `session_id`), cycled.

"About N tokens" of text is N words drawn from a list of short common words, which BPE
tokenizers of current models encode as about one token each; servers report the exact count.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vllm_fleet.errors import ConfigError

WORDS = (  # also the stand-in tokenizer's words (benchmarks/gpu/make_model.py --bench-words)
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there one all we their been has when who will more no if out so up said what its about than "
    "into them can only other new some could time these two may then do first any my now such like our over man me "
    "even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off come since "
    "against go came right used take three small house water city river light music table paper story market game"
).split()


@dataclass(slots=True)
class BenchItem:
    """One request to make. Exactly one of `prompt` / `messages` is the input; `token_ids`,
    when set, is the same prompt as token ids for targets that accept them."""

    item_id: str
    kind: str
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    token_ids: list[int] | None = None
    session_id: str = ""
    approx_prompt_tokens: int = 0


def words(rng: np.random.Generator, count: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=count))


def _between(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    low, high = bounds
    return int(rng.integers(low, high + 1))


class Workload:
    """Base: `items()` yields BenchItems forever, the same ones for the same seed."""

    name = "workload"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def items(self) -> Iterator[BenchItem]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


class RandomWorkload(Workload):
    name = "random"

    def __init__(self, input_len: int, output_len: int, *, seed: int = 0,
                 token_id_range: tuple[int, int] = (1000, 30000)) -> None:
        super().__init__(seed)
        if input_len < 1 or output_len < 1:
            raise ConfigError("--input-len and --output-len must be at least 1")
        self.input_len, self.output_len, self.token_id_range = input_len, output_len, token_id_range

    def items(self) -> Iterator[BenchItem]:
        rng = np.random.default_rng(self.seed)
        low, high = self.token_id_range
        n = 0
        while True:
            token_ids = [int(t) for t in rng.integers(low, high, size=self.input_len)]
            yield BenchItem(item_id=f"random-{n}", kind="random", max_tokens=self.output_len,
                            prompt=words(rng, self.input_len), token_ids=token_ids,
                            approx_prompt_tokens=self.input_len)
            n += 1

    def describe(self) -> str:
        return f"random (input {self.input_len}, output {self.output_len} tokens)"


@dataclass
class _Conversation:
    session_id: str
    turns_left: int
    history: list[dict[str, str]] = field(default_factory=list)


class ProductionMix(Workload):
    """60 % questions, 30 % conversation turns, 10 % long-text summaries (lengths in tokens)."""

    name = "mix"
    shares = (("question", 0.6), ("conversation", 0.3), ("summary", 0.1))
    question_in, question_out = (32, 128), (64, 128)
    turn_in, turn_out, turns = (16, 64), (48, 96), (3, 5)
    summary_in, summary_out = (600, 1000), (96, 160)
    open_conversations = 4   # conversations in progress at once; their turns interleave

    def items(self) -> Iterator[BenchItem]:
        rng = np.random.default_rng(self.seed)
        kinds = [k for k, _ in self.shares]
        weights = [w for _, w in self.shares]
        conversations: list[_Conversation] = []
        n = sessions = 0
        while True:
            kind = kinds[int(rng.choice(len(kinds), p=weights))]
            item_id = f"{kind}-{n}"
            if kind == "question":
                length = _between(rng, self.question_in)
                yield BenchItem(item_id, kind, _between(rng, self.question_out),
                                messages=[{"role": "user", "content": words(rng, length) + "?"}],
                                approx_prompt_tokens=length)
            elif kind == "summary":
                length = _between(rng, self.summary_in)
                text = "Summarize the following text.\n\n" + words(rng, length)
                yield BenchItem(item_id, kind, _between(rng, self.summary_out),
                                messages=[{"role": "user", "content": text}], approx_prompt_tokens=length)
            else:
                if len(conversations) < self.open_conversations:
                    conversations.append(_Conversation(f"session-{self.seed}-{sessions}", _between(rng, self.turns)))
                    sessions += 1
                yield self._turn(rng, conversations, item_id)
            n += 1

    def _turn(self, rng: np.random.Generator, conversations: list[_Conversation], item_id: str) -> BenchItem:
        conv = conversations[int(rng.integers(0, len(conversations)))]
        length = _between(rng, self.turn_in)
        conv.history.append({"role": "user", "content": words(rng, length)})
        max_tokens = _between(rng, self.turn_out)
        messages = list(conv.history)
        # The next turn carries an answer of the length this one asks for; the real answer is
        # not waited for, so arrivals stay open-loop.
        conv.history.append({"role": "assistant", "content": words(rng, max_tokens)})
        conv.turns_left -= 1
        if conv.turns_left <= 0:
            conversations.remove(conv)
        approx = sum(len(m["content"].split()) for m in messages)
        return BenchItem(item_id, "conversation", max_tokens, messages=messages,
                         session_id=conv.session_id, approx_prompt_tokens=approx)

    def describe(self) -> str:
        return "production mix (60% questions, 30% multi-turn sessions, 10% long summaries)"


class SharedPrefixWorkload(Workload):
    name = "prefix"

    def __init__(self, groups: int, prefix_len: int, input_len: int, output_len: int, *, seed: int = 0) -> None:
        super().__init__(seed)
        if groups < 1 or prefix_len < 1:
            raise ConfigError("--prefix-groups and --prefix-len must be at least 1")
        self.groups, self.prefix_len, self.input_len, self.output_len = groups, prefix_len, input_len, output_len

    def items(self) -> Iterator[BenchItem]:
        rng = np.random.default_rng(self.seed)
        prefixes = [f"Context {g}: " + words(rng, self.prefix_len) for g in range(self.groups)]
        n = 0
        while True:
            group = int(rng.integers(0, self.groups))
            prompt = prefixes[group] + "\nQuestion: " + words(rng, self.input_len) + "?"
            yield BenchItem(f"prefix{group}-{n}", f"prefix{group}", self.output_len, prompt=prompt,
                            approx_prompt_tokens=self.prefix_len + self.input_len)
            n += 1

    def describe(self) -> str:
        return (f"shared prefix ({self.groups} groups, prefix {self.prefix_len} + {self.input_len} tokens, "
                f"output {self.output_len})")


class JsonlWorkload(Workload):
    name = "jsonl"

    def __init__(self, path: str | Path, default_max_tokens: int, *, seed: int = 0) -> None:
        super().__init__(seed)
        self.path = Path(path)
        self.default_max_tokens = default_max_tokens
        self.rows = self._load()

    def _load(self) -> list[dict]:
        if not self.path.exists():
            raise ConfigError(f"--prompts {self.path}: no such file")
        rows = []
        for lineno, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{self.path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not (isinstance(row.get("prompt"), str) or isinstance(row.get("messages"), list)):
                raise ConfigError(f"{self.path}:{lineno}: each line needs a string 'prompt' or a list 'messages'")
            rows.append(row)
        if not rows:
            raise ConfigError(f"{self.path}: no prompts in the file")
        return rows

    def items(self) -> Iterator[BenchItem]:
        n = 0
        while True:
            row = self.rows[n % len(self.rows)]
            text = row.get("prompt") or " ".join(str(m.get("content", "")) for m in row["messages"])
            yield BenchItem(f"jsonl-{n}", "jsonl", int(row.get("max_tokens") or self.default_max_tokens),
                            prompt=row.get("prompt"), messages=row.get("messages"),
                            session_id=str(row.get("session_id") or ""), approx_prompt_tokens=len(text.split()))
            n += 1

    def describe(self) -> str:
        return f"prompts from {self.path} ({len(self.rows)} rows)"


def make_workload(config) -> Workload:
    """The workload a BenchConfig names."""
    if config.workload == "random":
        return RandomWorkload(config.input_len, config.output_len, seed=config.seed)
    if config.workload == "mix":
        return ProductionMix(seed=config.seed)
    if config.workload == "prefix":
        return SharedPrefixWorkload(config.prefix_groups, config.prefix_len, config.input_len, config.output_len,
                                    seed=config.seed)
    if not config.prompts:
        raise ConfigError("--workload jsonl needs --prompts FILE (one {'prompt': ...} or {'messages': [...]} per line)")
    return JsonlWorkload(config.prompts, config.output_len, seed=config.seed)
