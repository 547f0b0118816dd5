"""The router tokenizes prompts on a thread (cache/hook.py) so that its event loop keeps serving
every other stream meanwhile. `tokenizers.Tokenizer.encode` holds the GIL for its whole call, which
made the thread useless for a long document: the loop stood still until it was tokenized (#49
goal 2). Texts of RELEASE_GIL_CHARS and more are encoded with the GIL released."""

from __future__ import annotations

import threading
import time

from vllm_fleet.router.prompt.tokenizers import PromptTokenizer


def _steps_for(seconds: float) -> int:
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        steps += 1
    return steps


def test_the_loops_thread_runs_while_a_prompt_is_tokenized_on_another(tokenizer_folder):
    backend = PromptTokenizer.load(tokenizer_folder)._backend   # what a new piece of a prompt is encoded through
    text = " ".join(f"paragraph{i} of a long report on rivers and mountains" for i in range(20_000))
    state: dict = {"started": False, "done": False}

    def tokenize() -> None:
        state["started"] = time.perf_counter()
        state["ids"] = backend.encode(text, add_special_tokens=False).ids
        state["seconds"] = time.perf_counter() - state["started"]
        state["done"] = True

    thread = threading.Thread(target=tokenize)
    thread.start()
    steps_while_tokenizing = 0
    while not state["done"]:
        if state["started"]:
            steps_while_tokenizing += 1
    thread.join()
    seconds = state["seconds"]
    alone = _steps_for(seconds)   # this thread's pace with nothing beside it, just after

    assert state["ids"] == backend._backend.encode(text, add_special_tokens=False).ids, "the same ids as encode's"
    # Holding the GIL, the tokenizer left this thread one switch interval (5 ms) of a call that
    # takes hundreds: under 2% of its pace. Releasing it, this thread keeps most of its pace.
    assert steps_while_tokenizing > 0.2 * alone, (steps_while_tokenizing, alone, seconds)
