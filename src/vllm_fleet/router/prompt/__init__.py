"""The prompt wing: a request's prompt token ids at the router, as the worker's engine will see them.

Cache-aware routing keys a prompt by its token ids before it picks a worker; the worker renders
and tokenizes on its side. This wing repeats that rendering with the served model's own
tokenizer files, off the decision's critical path where it can.

Modules:
    tokenizers   PromptTokenizer and TokenizerCache: render and tokenize as the worker's vLLM
                 would, from the tokenizer files a worker sends; one tokenizer per model
    chat_render  vLLM's decisions in rendering a chat request (conversation, template arguments)
    segments     SegmentTokenizer: exact tokenization piece by piece from a bounded cache;
                 PartialIds, a long prompt's head first
    head_cut     where a piece of text can be cut so that its parts tokenize as the whole does

Imports run one way: tokenizers -> (chat_render, segments -> head_cut). Nothing here imports
the rest of the router.
"""
