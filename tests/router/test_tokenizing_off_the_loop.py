"""The router tokenizes prompts on a thread (cache/hook.py) so that its event loop keeps serving
every other stream meanwhile. `tokenizers.Tokenizer.encode` holds the GIL for its whole call, which
made the thread useless for a long document: the loop stood still until it was tokenized (#49
goal 2). Texts of RELEASE_GIL_CHARS and more are encoded with the GIL released."""

from __future__ import annotations

import sys
import threading

from vllm_fleet.router.prompt.tokenizers import RELEASE_GIL_CHARS, PromptTokenizer


def test_another_thread_runs_while_a_long_prompt_is_tokenized(tokenizer_folder):
    backend = PromptTokenizer.load(tokenizer_folder)._backend   # what a new piece of a prompt is encoded through
    text = " ".join(f"paragraph{i} of a long report on rivers and mountains" for i in range(20_000))
    assert len(text) >= RELEASE_GIL_CHARS
    started, state = threading.Event(), {"done": False}

    def tokenize() -> None:
        started.set()
        state["ids"] = backend.encode(text, add_special_tokens=False).ids
        state["done"] = True

    # No forced GIL switch for the test's length: this thread can run during the encode only if
    # the encode lets go of the GIL, whatever the machine's speed.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        thread = threading.Thread(target=tokenize)
        thread.start()
        started.wait()
        ran_during_the_encode = not state["done"]
        thread.join()
    finally:
        sys.setswitchinterval(interval)

    assert ran_during_the_encode, "the tokenizer held the GIL: the event loop would stand still"
    assert state["ids"] == backend._backend.encode(text, add_special_tokens=False).ids, "the same ids as encode's"
