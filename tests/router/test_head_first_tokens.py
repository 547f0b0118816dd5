"""Head-first tokenization of long new text (router/prompt/head_cut.py, SegmentTokenizer.encode's
`head_chars`, CacheRouting.match): the cut is exact on the packaged model's tokenizer, a
fresh long prompt's decision tokenizes only a head and routes as full tokenization does, a held
prefix gets the whole text tokenized, and a tokenizer whose cuts are not known exact is never cut."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import NamedTuple

import pytest
from prometheus_client import CollectorRegistry
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from vllm_fleet.models import resolve_model
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.kv_events import BlocksStored, KvEventBatch
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.router.cache.routing import CachePrompt, CacheRouting
from vllm_fleet.router.prompt.chat_render import Unrenderable
from vllm_fleet.router.config import RouterConfig
from vllm_fleet.router.features import RequestFeatures, features_of
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.router.prompt.head_cut import all_cuts, cut_before, exact_cuts
from vllm_fleet.router.policies import make_policy
from vllm_fleet.router.prompt.tokenizers import PromptTokenizer
from vllm_fleet.router.prompt.segments import PartialIds, SegmentTokenizer
from vllm_fleet.router.pool.snapshot import PoolSnapshot, WorkerView

MODEL, BS = "m", 16
WORKERS = [f"w{n}" for n in range(4)]


@pytest.fixture(scope="module")
def folder() -> Path:
    return Path(resolve_model(None, None).path)


def _document(seed: int, chars: int = 8000) -> str:
    rng = random.Random(seed)
    vocabulary = ["river", "naïve", "数据", "😀", "don't", "it's", "x1", "12345", "\n", "\n\n", "  ", "\t",
                  "(a)", "CamelCase", "'s", "e\u0301t\u00e9", "foo.bar", ",", "über", "the"]
    out: list[str] = []
    while sum(map(len, out)) < chars:
        out.append(rng.choice(vocabulary) + rng.choice(["", " ", " ", "  ", "\n"]))
    return "".join(out)


class Counting:
    """A `tokenizers.Tokenizer` that counts the characters it encodes."""

    def __init__(self, backend) -> None:
        self.backend, self.chars = backend, 0

    def encode(self, text: str, **kwargs):
        self.chars += len(text)
        return self.backend.encode(text, **kwargs)


def test_cuts_are_exact_on_the_packaged_tokenizer(folder):
    backend = PromptTokenizer.load(folder)._tokenizer.backend_tokenizer
    assert exact_cuts(backend) is None
    for seed in range(40):
        text = _document(seed, 600)
        cuts = [0, *all_cuts(text), len(text)]
        assert len(cuts) > 10
        parts = [i for a, b in zip(cuts, cuts[1:]) for i in backend.encode(text[a:b], add_special_tokens=False).ids]
        assert parts == backend.encode(text, add_special_tokens=False).ids, text


def test_a_cut_is_after_an_ascii_letter_before_a_space():
    assert cut_before("abc def ghi", 8) == 7
    assert cut_before("abc def ghi", 6) == 3
    assert cut_before("été  数据 1 2 ,, ", 20) == 0        # no ASCII letter before any space
    assert cut_before("ab  cd", 10) == 2                 # a run of spaces: cut before it, not inside
    assert all_cuts("a b\nc d, e 's") == [1, 5, 10]


def test_a_long_new_piece_is_tokenized_head_first_and_completes_exactly(folder):
    prompts, whole = PromptTokenizer.load(folder), PromptTokenizer.load(folder, piece_cache_chars=0)
    text = "<|im_start|>user\n" + _document(1) + "<|im_end|>\n<|im_start|>assistant\n"
    backend = Counting(prompts._tokenizer.backend_tokenizer)
    partial = prompts.pieces.encode(backend, text, add_special_tokens=False, head_chars=1000)
    expected = whole.completion_ids(text, add_special_tokens=False)
    assert isinstance(partial, PartialIds)
    assert backend.chars <= 1000 + len("user\n")
    assert partial.head == expected[:len(partial.head)] and len(partial.head) > 100
    assert abs(partial.estimated_tokens - len(expected)) < 0.25 * len(expected)
    assert partial.complete() == expected
    assert backend.chars == len(text) - 2 * len("<|im_start|>") - len("<|im_end|>")   # each character once
    assert prompts.pieces.encode(backend, text, add_special_tokens=False, head_chars=1000) == expected  # cached


def test_a_tokenizer_that_is_not_byte_level_is_never_cut():
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([AddedToken("<|sep|>", normalized=False, special=True)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    pieces = SegmentTokenizer.build(tokenizer)
    assert pieces is not None and not pieces.exact_cuts
    text = "hello world " * 500 + "<|sep|>hello"
    assert pieces.encode(backend, text, add_special_tokens=False, head_chars=100) == \
        list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_a_normalizer_other_than_nfc_refuses_cuts(folder):
    backend = Tokenizer.from_str(PromptTokenizer.load(folder)._tokenizer.backend_tokenizer.to_str())
    backend.normalizer = normalizers.Lowercase()
    assert exact_cuts(backend) is not None


class OneModel:
    """TokenizerCache's `ids_for` for one loaded model."""

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self.tokenizer = tokenizer

    def ids_for(self, model, body, **kwargs):
        return self.tokenizer.request_ids(body, **kwargs)

    def warm_next_turn(self, model, body, messages, answer):
        self.tokenizer.warm_next_turn(body, messages, answer)


def _routing(folder: Path, head_chars: int) -> CacheRouting:
    routing = CacheRouting(RouterConfig(policy="cache_aware"), connect=lambda address: None,
                           metrics=RouterMetrics(CollectorRegistry()),
                           tokenizers=OneModel(PromptTokenizer.load(folder)))
    routing.head_chars = head_chars
    for address in WORKERS:
        routing.index.apply(address, KvEventBatch("e", 0, 0.0, (), snapshot=True, block_size=BS), model=MODEL)
    return routing


def _store(routing: CacheRouting, address: str, ids: list[int], sequence: int) -> None:
    blocks = len(ids) // BS
    hashes = tuple((sequence * 10_000 + i).to_bytes(8, "big") for i in range(blocks))
    event = BlocksStored(hashes, None, tuple(ids[:blocks * BS]), BS)
    routing.index.apply(address, KvEventBatch("e", sequence, 0.0, (event,)), model=MODEL)


class Decided(NamedTuple):
    """What the cache routing made of a request: the features the policy weighs, the prompt as keyed
    with who holds it (`prompt.match`, the policy's cache input)."""

    features: RequestFeatures
    prompt: CachePrompt


def _decide(routing: CacheRouting, messages: list[dict]):
    request = build_request("r", [GenerateInput(messages=messages)], SamplingParams(max_tokens=64))
    config = routing.config
    features = features_of(request, model=MODEL, prefix_chars=config.prefix_chars,
                           default_max_tokens=config.default_max_tokens,
                           long_prompt_tokens=config.admission.long_prompt_tokens,
                           long_max_tokens=config.admission.long_max_tokens)
    features, prompt = routing.match(request, features)
    views = PoolSnapshot(tuple(WorkerView(a, model=MODEL, kv_events_fresh=True, outstanding_tokens=100 * n)
                               for n, a in enumerate(WORKERS)))
    return Decided(features, prompt), make_policy("cache_aware").rank(features, views, prompt.match)[0], request


def _chat(system: str, document: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": document}]


def encoding_counted(monkeypatch) -> list[int]:
    """From now on, the characters each prompt's pieces sent through the tokenizer (one entry a prompt)."""
    encoded: list[int] = []
    original = SegmentTokenizer._join

    def counting(self, backend, *args):
        counter = Counting(backend)
        try:
            return original(self, counter, *args)
        finally:
            encoded.append(counter.chars)
    monkeypatch.setattr(SegmentTokenizer, "_join", counting)
    return encoded


def test_a_fresh_long_prompt_is_keyed_from_a_head_and_routes_as_whole_tokenization(folder, monkeypatch):
    head, whole = _routing(folder, 1000), _routing(folder, 0)

    # A system prompt held on w2 (several blocks), then a document nobody has seen.
    system = "You are a careful assistant. Answer briefly and cite the document. " * 5
    for routing in (head, whole):
        held = _chat(system, "What is new?")
        _, _, request = _decide(routing, held)
        _store(routing, "w2", routing.prompt_ids(request, MODEL), 1)
    messages = _chat(system, _document(7))
    encoded = encoding_counted(monkeypatch)
    features, worker, request = _decide(head, messages)
    assert sum(encoded) < 1200                                     # the head only, of ~8,000 characters
    expected, expected_worker, _ = _decide(whole, messages)
    (features, prompt), (expected, whole_prompt) = features, expected
    assert prompt.ids_len == 0 and len(prompt.block_keys) < len(whole_prompt.block_keys) // 3
    assert prompt.block_keys == whole_prompt.block_keys[:len(prompt.block_keys)]
    assert prompt.match.cached_tokens == whole_prompt.match.cached_tokens and prompt.match.held("w2") > 0
    assert prompt.match.frontier_key == whole_prompt.match.frontier_key
    assert abs(features.prompt_tokens - expected.prompt_tokens) < 0.25 * expected.prompt_tokens
    assert worker == expected_worker


def test_a_head_keyed_prompt_is_held_whole_where_it_went_soon_after_the_pick(folder):
    # The decision keys only the head of a new document; the next request for the same document
    # (the next Spark row sharing it, before the engine's events) must still find all of it where
    # the first one went, or it weighs a few blocks against the load and may go elsewhere.
    head, whole = _routing(folder, 250), _routing(folder, 0)
    messages = _chat("Answer from the document.", _document(9))
    features, _, _ = _decide(head, messages)
    expected, _, _ = _decide(whole, messages)
    assert features.prompt.ids_len == 0 and len(features.prompt.block_keys) < len(expected.prompt.block_keys) // 3
    hold = head.routed("w3", *features)
    head.close(wait=True)  # the rest is keyed on the router's keying thread
    held = head.index.matched_tokens(MODEL, list(expected.prompt.block_keys))
    assert held == {"w3": len(expected.prompt.block_keys) * BS}
    hold.release()  # no first token: nothing was stored, every entry goes, the rest's too
    assert head.index.matched_tokens(MODEL, list(expected.prompt.block_keys)) == {}


def test_the_rest_of_an_attempt_that_already_ended_is_not_held(folder):
    routing = _routing(folder, 250)
    hold = routing.index.note_routed("w1", MODEL, [11, 12])
    hold.release()
    routing.index.extend_hold(hold, "w1", MODEL, [13, 14])
    assert routing.index.matched_tokens(MODEL, [11, 12, 13, 14]) == {}


def test_a_prompt_held_past_the_head_is_tokenized_whole(folder):
    head, whole = _routing(folder, 1000), _routing(folder, 0)
    document = _document(8)
    for routing in (head, whole):   # w1 holds the document; the next request asks another question after it
        _, _, request = _decide(routing, _chat("Answer from the document.", document))
        _store(routing, "w1", routing.prompt_ids(request, MODEL), 1)
    messages = _chat("Answer from the document.", document + " And then, what?")
    features, worker, _ = _decide(head, messages)
    expected, expected_worker, _ = _decide(whole, messages)
    (features, prompt), (expected, whole_prompt) = features, expected
    assert prompt.ids_len == whole_prompt.ids_len > 0
    assert prompt.block_keys == whole_prompt.block_keys
    assert prompt.match.cached_tokens == whole_prompt.match.cached_tokens and prompt.match.held("w1") > 1000
    assert features.prompt_tokens == expected.prompt_tokens and worker == expected_worker == "w1"


def test_the_agreement_corpus_cut_at_small_heads_completes_to_the_same_ids(folder):
    """benchmarks/tokenize_agreement.py's requests (the worker checks those ids), every piece
    over 60 characters cut near 30: the heads are prefixes and complete() gives the same ids."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tokenize_agreement.py"
    spec = importlib.util.spec_from_file_location("tokenize_agreement_heads", path)
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    rng = random.Random(0)
    cases = [corpus.chat_request(rng, i) for i in range(130)] + corpus.edge_cases()
    cases += [corpus.completion_request(rng, i) for i in range(60)]
    cut, plain = PromptTokenizer.load(folder), PromptTokenizer.load(folder, piece_cache_chars=0)
    partial = 0
    for case in cases:
        kwargs = dict(messages=case.get("messages"), prompt=case.get("prompt"))
        try:
            expected = plain.request_ids(case["body"], **kwargs)
        except Unrenderable:
            continue
        ids = cut.request_ids(case["body"], **kwargs, head_chars=30)
        if isinstance(ids, PartialIds):
            partial += 1
            assert ids.head == expected[:len(ids.head)]
            ids = ids.complete()
        assert ids == expected
    assert partial > 50
