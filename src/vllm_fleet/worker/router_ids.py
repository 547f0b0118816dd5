"""A router's prompt token ids on the worker: trusted, and verified.

A cache-aware router renders and tokenizes each prompt before it picks a worker
(router/prompt/tokenizers.py), with the tokenizer files this worker sends (TokenizerFiles). With
`--accept-router-ids` the worker may run those ids instead of rendering the prompt again: a
~2,000-token chat prompt's chat template and tokenizer are CPU the GPU host no longer spends
(benchmarks/RESULTS.md, "The router's ids on the worker").

The worker stays the authority for what the engine runs:

* Ids are taken only from a router that rendered them with the same files: the input names their
  digest, which must equal this worker's (`files_digest` of the files it sends), and only for
  prompts whose ids alone stand for them: a text or chat prompt of the chat or completions
  endpoint, not resumed, without `truncate_prompt_tokens` (vLLM cuts the rendered prompt), not a
  completion with `echo` (which sends the prompt's text back).
* Trust but verify: the first `router_ids_verify_first` prompts that carry ids, and then 1 in
  `router_ids_verify_every`, are rendered here anyway and compared. On a difference the worker's
  own ids run, the request id is logged, and the worker takes no router ids for the rest of its
  life: one mismatch shows the two renderings disagree somewhere, and which prompts is unknown.
  Ids outside the vocabulary are a mismatch too (a router's fault, never the request's).
* vLLM's checks on the prompt still run on the ids (openai/render.py `render_ids`: the context
  length, the answer's room), and prepare.py's own (vocabulary, length) as for any ids.

The counters are on /metrics as `vllm_fleet_worker_router_ids_total{outcome}`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from vllm_fleet.config import WorkerConfig
from vllm_fleet.errors import TokenizerFilesError
from vllm_fleet.protocol.tokenizer_files import folder_digest
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest
from vllm_fleet.worker.engines.base import Engine
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.tokenizer_files import tokenizer_folder

logger = logging.getLogger(__name__)

# The endpoints whose prompt is the rendered messages or text as such (Responses and Anthropic's
# Messages are converted by vLLM on the worker first: the router never renders them).
_ENDPOINTS = ("chat", "completion")


class RouterIds:
    """One worker's account of router ids: whether it takes them, which to verify, and its counters."""

    def __init__(self, config: WorkerConfig, metrics: WorkerMetrics) -> None:
        self.enabled = config.accept_router_ids
        self.verify_first = config.router_ids_verify_first
        self.verify_every = config.router_ids_verify_every
        self.digest = ""          # of this worker's tokenizer files; "" = none (then no ids are taken)
        self.trusted = True       # False after a mismatch, for good
        self.offers = 0           # prompts that came with usable ids (what sampling counts)
        self._metrics = metrics

    async def start(self, engine: Engine) -> None:
        """Compute the digest of the tokenizer files the engine serves (a few MB read, in a thread)."""
        try:
            folder = tokenizer_folder(engine.tokenizer_source, engine.tokenizer_revision)
            self.digest = await asyncio.to_thread(folder_digest, folder)
        except (TokenizerFilesError, OSError) as exc:
            self.digest = ""
            if self.enabled:
                logger.warning("--accept-router-ids: no tokenizer files to compare with (%s); router ids are "
                               "not taken", exc)

    @property
    def takes(self) -> bool:
        """What WorkerInfo.takes_router_ids says."""
        return self.enabled and self.trusted and bool(self.digest)

    def offered(self, request: GenerateRequest, item: GenerateInput, vllm_request: Any,
                vocab_size: int | None) -> list[int] | None:
        """The router's ids for this input when they may stand for its prompt, else None (then the
        worker renders; ids that came but may not be used count as declined)."""
        ids = item.router_token_ids
        if not ids:
            return None
        if not self._may_use(request, item, vllm_request):
            self._metrics.router_ids.labels("declined").inc()
            return None
        self.offers += 1
        if vocab_size is not None and max(ids) >= vocab_size:  # not a rendering of this tokenizer
            self._mismatch(request.request_id, f"token id {max(ids)} is outside the vocabulary of {vocab_size}")
            return None
        return ids

    def _may_use(self, request: GenerateRequest, item: GenerateInput, vllm_request: Any) -> bool:
        if not self.takes or item.router_ids_digest != self.digest:
            return False
        if item.token_ids is not None or item.resume_token_ids or request.body.endpoint not in _ENDPOINTS:
            return False
        if getattr(vllm_request, "truncate_prompt_tokens", None) is not None:
            return False
        return not getattr(vllm_request, "echo", False)

    def should_verify(self) -> bool:
        """Whether the prompt just offered is rendered here and compared (the first ones, then 1 in M)."""
        return self.offers <= self.verify_first or (self.offers - self.verify_first) % self.verify_every == 0

    def used(self) -> None:
        self._metrics.router_ids.labels("used").inc()

    def compare(self, request_id: str, router_ids: list[int], own_ids: list[int]) -> bool:
        """The worker's own rendering against the router's; a difference ends the trust."""
        if router_ids == own_ids:
            self._metrics.router_ids.labels("verified").inc()
            return True
        first = next((i for i, (a, b) in enumerate(zip(router_ids, own_ids)) if a != b), min(len(router_ids),
                                                                                          len(own_ids)))
        self._mismatch(request_id, f"{len(router_ids)} router ids, {len(own_ids)} rendered here, first difference "
                                   f"at position {first}")
        return False

    def _mismatch(self, request_id: str, what: str) -> None:
        self._metrics.router_ids.labels("mismatched").inc()
        if self.trusted:
            self.trusted = False
            logger.warning("router token ids differ from this worker's rendering (%s); the worker's own ids ran, and "
                           "router ids are no longer taken by this worker", what, extra={"request_id": request_id})
        else:
            logger.warning("router token ids differ from this worker's rendering (%s)", what,
                           extra={"request_id": request_id})
