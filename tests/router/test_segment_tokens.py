"""The router's piece cache (router/prompt/segments.py): ids from cached pieces equal the
tokenizer's ids of the whole text, on the packaged model and on the tokenize_agreement corpus;
a repeated system prompt or earlier turn is not tokenized again; the bound holds; a tokenizer
whose pieces would tokenize otherwise is never split."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from vllm_fleet.models import resolve_model
from vllm_fleet.router.prompt import segments
from vllm_fleet.router.prompt.chat_render import Unrenderable
from vllm_fleet.router.prompt.tokenizers import PromptTokenizer
from vllm_fleet.router.prompt.segments import SegmentCache, SegmentTokenizer

AGREEMENT = Path(__file__).resolve().parents[2] / "benchmarks" / "tokenize_agreement.py"


@pytest.fixture(scope="module")
def folder() -> Path:
    return Path(resolve_model(None, None).path)


@pytest.fixture(scope="module")
def cached(folder) -> PromptTokenizer:
    return PromptTokenizer.load(folder)


@pytest.fixture(scope="module")
def whole(folder) -> PromptTokenizer:
    """The same tokenizer without the cache: every text tokenized whole, as before."""
    tokenizer = PromptTokenizer.load(folder, piece_cache_chars=0)
    assert tokenizer.pieces is None
    return tokenizer


def _document(seed: int, words: int = 1500) -> str:
    rng = random.Random(seed)
    vocabulary = "the river runs north über café 数据 😀 don't  spaces\ttabs\n\nnew paragraph 1234".split(" ")
    return " ".join(rng.choice(vocabulary) for _ in range(words))


def test_the_packaged_model_is_split_at_its_special_tokens(cached):
    assert cached.pieces is not None and cached.pieces._wrap == ((), ())


def test_a_shared_system_prompt_is_tokenized_once_and_the_ids_stay_exact(cached, whole):
    system = {"role": "system", "content": _document(1)}
    first = [system, {"role": "user", "content": "Summarise it."}]
    second = [system, {"role": "user", "content": "Which rivers? <|im_start|> in the question"}]
    assert cached.chat_ids(first) == whole.chat_ids(first)
    misses = cached.pieces.cache.misses
    assert cached.chat_ids(second) == whole.chat_ids(second)
    # Only the new question's pieces were tokenized (split at the <|im_start|> the user wrote, as
    # the tokenizer splits it); the 1,500-word system prompt came from the cache.
    assert cached.pieces.cache.misses - misses == 2
    assert system["content"] in cached.pieces.cache._entries or f"system\n{system['content']}" in cached.pieces.cache._entries


def test_the_next_turn_of_a_conversation_reuses_the_earlier_turns(cached, whole):
    turns = [{"role": "system", "content": "You are terse."}]
    for n in range(6):
        turns += [{"role": "user", "content": _document(10 + n, 200)}]
        assert cached.chat_ids(turns) == whole.chat_ids(turns)
        misses = cached.pieces.cache.misses
        assert cached.chat_ids(turns) == whole.chat_ids(turns)      # the same request again: all cached
        assert cached.pieces.cache.misses == misses
        turns += [{"role": "assistant", "content": _document(20 + n, 50)}]


@pytest.mark.parametrize("text", ["<|im_start|>user\nhi<|im_end|>", "  leading", "trailing\n\n", "x<|endoftext|>",
                                  "<|im_end|><|im_end|>  <|im_start|> ' s", "ü" * 40 + "<filename>a.py<file_sep>"])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_completion_text_equals_the_whole_text(cached, whole, text, add_special_tokens):
    for _ in range(2):   # the second time from the cache
        assert cached.completion_ids(text, add_special_tokens=add_special_tokens) == \
            whole.completion_ids(text, add_special_tokens=add_special_tokens)


def _agreement_module():
    spec = importlib.util.spec_from_file_location("tokenize_agreement_corpus", AGREEMENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ids(tokenizer: PromptTokenizer, case: dict) -> list[int] | str:
    try:
        return tokenizer.request_ids(case["body"], messages=case.get("messages"), prompt=case.get("prompt"))
    except Unrenderable as exc:
        return f"unrenderable: {exc}"


def test_the_agreement_corpus_tokenizes_alike_from_the_cache(folder, tmp_path):
    """benchmarks/tokenize_agreement.py's 354 requests, both templates, twice (the second pass
    all from the cache): the same ids as whole texts (that benchmark checks those against the worker)."""
    corpus = _agreement_module()
    rng = random.Random(0)
    chats = [corpus.chat_request(rng, i) for i in range(130)] + corpus.edge_cases()
    completions = [corpus.completion_request(rng, i) for i in range(60)]
    tools = tmp_path / "tools-model"
    tools.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tools / name).write_bytes((folder / name).read_bytes())
    (tools / "chat_template.jinja").write_text(corpus.TOOLS_TEMPLATE)
    compared = 0
    for model, cases in ((folder, chats + completions), (tools, chats)):
        cached, plain = PromptTokenizer.load(model), PromptTokenizer.load(model, piece_cache_chars=0)
        assert cached.pieces is not None
        expected = [_ids(plain, case) for case in cases]
        for _ in range(2):
            assert [_ids(cached, case) for case in cases] == expected
        assert cached.pieces.cache.hits > len(cases)
        compared += len(cases)
    assert compared == 354


def test_the_bound_holds_and_the_least_recently_used_go_first(cached, whole):
    tokenizer = SegmentTokenizer.build(cached._tokenizer, max_chars=2_000, max_entries=8)
    backend = cached._tokenizer.backend_tokenizer
    texts = [f"<|im_start|>user\n{_document(n, 30)}<|im_end|>\n" for n in range(40)]
    for text in texts:
        assert tokenizer.encode(backend, text, add_special_tokens=False) == whole.completion_ids(text, add_special_tokens=False)
        assert tokenizer.cache.chars <= 2_000 and len(tokenizer.cache) <= 8
        assert tokenizer.cache.chars == sum(len(piece) for piece in tokenizer.cache._entries)
    recent = f"user\n{_document(39, 30)}"
    assert recent in tokenizer.cache._entries and f"user\n{_document(0, 30)}" not in tokenizer.cache._entries
    tokenizer.encode(backend, texts[30], add_special_tokens=False)   # touched: survives the next ones
    for text in texts[35:]:
        tokenizer.encode(backend, text, add_special_tokens=False)
    assert f"user\n{_document(30, 30)}" in tokenizer.cache._entries


def test_a_piece_over_a_quarter_of_the_bound_is_not_cached():
    cache = SegmentCache(max_chars=100, max_entries=10)
    from array import array
    cache.put("x" * 26, array("I", [1]))
    cache.put("y" * 25, array("I", [2]))
    assert list(cache._entries) == ["y" * 25] and cache.chars == 25


# --- tokenizers whose pieces would tokenize otherwise ----------------------------------------

VOCAB = {"[UNK]": 0, "▁hello": 1, "hello": 2, "▁world": 3, "world": 4, "▁": 5, "<s>": 6, "user": 7, "▁user": 8}
SEP_ID = len(VOCAB)


def _tokenizer(pre_tokenizer, token: AddedToken, post_processor=None) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizer
    backend.add_special_tokens([token])
    if post_processor is not None:
        backend.post_processor = post_processor
    return PreTrainedTokenizerFast(tokenizer_object=backend)


SEP = AddedToken("<|sep|>", normalized=False, special=True)
METASPACE_FIRST = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")


def test_metaspace_prepending_to_the_first_piece_only_is_never_split():
    tokenizer = _tokenizer(METASPACE_FIRST, SEP)
    # The piece after <|sep|> gets no "▁" inside the text, but would alone: splitting is wrong here.
    assert tokenizer("hello<|sep|>hello", add_special_tokens=False)["input_ids"] == [1, SEP_ID, 2]
    assert SegmentTokenizer.build(tokenizer) is None
    prompts = PromptTokenizer(tokenizer)
    assert prompts.pieces is None
    assert prompts.completion_ids("hello<|sep|>hello world", add_special_tokens=False) == [1, SEP_ID, 2, 3]


def test_the_probes_catch_what_the_structure_check_misses(monkeypatch):
    """A probe puts "user" after a token, as a chat template does: alone it would get its "▁"."""
    monkeypatch.setattr(segments, "_first_piece_only", lambda component: False)
    assert SegmentTokenizer.build(_tokenizer(METASPACE_FIRST, SEP)) is None


def test_an_added_token_that_strips_spaces_is_never_split_at():
    stripping = AddedToken("<|sep|>", normalized=False, special=True, rstrip=True)
    assert SegmentTokenizer.build(_tokenizer(pre_tokenizers.Whitespace(), stripping)) is None


def test_ids_added_around_the_text_are_placed_as_the_tokenizer_places_them():
    bos = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 6)])
    tokenizer = _tokenizer(pre_tokenizers.Whitespace(), SEP, bos)
    pieces = SegmentTokenizer.build(tokenizer)
    assert pieces is not None and pieces._wrap == ((6,), ())
    prompts = PromptTokenizer(tokenizer)
    for text in ("hello world<|sep|>world", "<|sep|>", "hello"):
        for add in (True, False):
            assert prompts.completion_ids(text, add_special_tokens=add) == \
                list(tokenizer(text, add_special_tokens=add)["input_ids"])
