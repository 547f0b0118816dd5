"""Conversations: the rows of one session run in turn order, each with the history so far.

Turn k is sent as chat messages = (turn 1's user message, turn 1's answer, ..., turn k's user
message), with `session_id` = the session key, so session affinity keeps the conversation on
one worker and its prefix cache serves the shared history. Sessions run concurrently (at most
`max_in_flight` at once); the turns of one session cannot, since each needs the last answer.
A failed turn ends its conversation: later turns get an error naming it instead of an answer
built on a missing one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from vllm_fleet.protocol.types import ChatMessage, GenerateInput
from vllm_fleet.spark.answerer import Answerer
from vllm_fleet.spark.config import SparkGenerateConfig
from vllm_fleet.spark.ledger import TaskLedger, session_scope
from vllm_fleet.spark.rows import RowResult, request_id_for, to_messages


@dataclass(slots=True)
class Turn:
    position: int   # the row's place in the partition
    turn: Any
    value: Any      # the prompt text or the turn's messages


def group_turns(sessions: list[Any], turns: list[Any], values: list[Any]) -> tuple[dict[Hashable, list[Turn]], dict[int, RowResult]]:
    """Rows grouped by session and sorted by turn; rows that cannot be placed get their error."""
    grouped: dict[Hashable, list[Turn]] = {}
    bad: dict[int, RowResult] = {}
    for position, (session, turn, value) in enumerate(zip(sessions, turns, values)):
        if session is None or turn is None:
            bad[position] = RowResult.failed("bad row: the session key or the turn is null")
            continue
        grouped.setdefault(_hashable(session), []).append(Turn(position, turn, value))
    for rows in grouped.values():
        rows.sort(key=lambda t: t.turn)
    return grouped, bad


async def answer_sessions(answerer: Answerer, config: SparkGenerateConfig, grouped: dict[Hashable, list[Turn]],
                          ledger: TaskLedger | None = None) -> dict[int, RowResult]:
    """Each row's result by position. With a ledger, a session's earlier turns that are not in
    this partition (a stream's earlier micro-batch) come from it, and turns it holds are replayed."""
    results: dict[int, RowResult] = {}
    slots = asyncio.Semaphore(config.max_in_flight)

    async def run(session: Hashable, turns: list[Turn]) -> None:
        async with slots:
            await _conversation(answerer, config, session, turns, results, ledger)

    await asyncio.gather(*(run(session, turns) for session, turns in grouped.items()))
    return results


async def _conversation(answerer: Answerer, config: SparkGenerateConfig, session: Hashable, turns: list[Turn],
                        results: dict[int, RowResult], ledger: TaskLedger | None) -> None:
    scope = session_scope(config.model, config.params)
    # Turns answered in earlier micro-batches (or jobs with the same model and params) are history too.
    history: list[ChatMessage] = ledger.history(scope, repr(session), turns[0].turn) if ledger else []
    broken: str | None = None
    for turn in turns:
        if broken is not None:
            results[turn.position] = RowResult.failed(f"not sent: {broken}")
            continue
        try:
            new = _turn_messages(turn.value, chat=config.messages_col is not None)
        except ValueError as exc:
            results[turn.position] = RowResult.failed(f"bad row: {exc}")
            broken = f"turn {turn.turn} of this session is a bad row"
            continue
        item = GenerateInput(messages=history + new)
        request_id = request_id_for(item, config.params, config.model, f"session:{session!r}:{turn.turn!r}")
        result = ledger.lookup(request_id) if ledger else None
        if result is None:
            result = await answerer.answer(item, request_id, session_id=str(session))
            if ledger:
                ledger.record(request_id, result, scope=scope, session=repr(session), turn=turn.turn,
                              messages=[[m.role, m.content or ""] for m in new])
        results[turn.position] = result
        if result.error is not None:
            broken = f"turn {turn.turn} of this session failed"
            continue
        history = [*history, *new, ChatMessage(role="assistant", content=result.output or "")]


def _turn_messages(value: Any, *, chat: bool) -> list[ChatMessage]:
    if value is None:
        raise ValueError("the prompt is null" if not chat else "the messages are null")
    if chat:
        try:
            return to_messages(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"messages must be a list of {{role, content}}: {exc}") from None
    return [ChatMessage(role="user", content=str(value))]


def _hashable(value: Any) -> Hashable:
    if isinstance(value, (list, dict)):
        return repr(value)
    return value
