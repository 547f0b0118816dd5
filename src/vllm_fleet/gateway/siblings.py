"""The other processes of one `gateway --processes N`, asked for their own numbers at scrape time.

A scrape of /metrics or /dashboard/state.json reaches whichever process the kernel gave the
connection. To answer for the whole gateway, that process asks its siblings for their own
figures and merges them (metrics_merge.py). Nothing is shared on the request path: the exchange
happens only when someone scrapes.

Each process answers on a Unix socket `<index>.sock` in a directory that the supervising parent
made for this gateway (mode 0700, so only its user can connect; it holds the same data that
/metrics gives an admin key). The exchange is one line in (`metrics`, `state`), then the answer's
length on a line and its bytes, then the connection closes; an answer cut short (its process
died while writing) is left out rather than merged half-read. A sibling that does not answer within `timeout_s` (it
is restarting, or stuck) is left out of that answer; callers say how many answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# What a process answers when asked for `name`: its own figures, never merged ones (asking the
# siblings in turn would ask the asker).
Answer = Callable[[], Awaitable[bytes]]
MAX_QUESTION_BYTES = 64


@dataclass(frozen=True, slots=True)
class SiblingSlot:
    """Where one process of N sits: its index and the directory the N sockets live in."""

    directory: Path
    index: int
    processes: int

    def socket_path(self, index: int) -> Path:
        return self.directory / f"{index}.sock"


class Siblings:
    def __init__(self, slot: SiblingSlot, *, timeout_s: float = 2.0) -> None:
        self.slot = slot
        self.timeout_s = timeout_s
        self._answers: dict[bytes, Answer] = {}
        self._server: asyncio.AbstractServer | None = None

    @property
    def processes(self) -> int:
        return self.slot.processes

    async def start(self, answers: dict[str, Answer]) -> None:
        self._answers = {name.encode(): answer for name, answer in answers.items()}
        path = self.slot.socket_path(self.slot.index)
        path.unlink(missing_ok=True)  # left by this slot's previous process, if it was killed
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self.slot.socket_path(self.slot.index).unlink(missing_ok=True)
            self._server = None

    async def ask(self, name: str) -> list[bytes]:
        """The answers of the other processes to `name`, from those that answered in time."""
        others = [i for i in range(self.slot.processes) if i != self.slot.index]
        replies = await asyncio.gather(*(self._ask_one(i, name.encode()) for i in others))
        return [reply for reply in replies if reply is not None]

    async def _ask_one(self, index: int, name: bytes) -> bytes | None:
        writer = None
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_unix_connection(str(self.slot.socket_path(index)))
                writer.write(name + b"\n")
                await writer.drain()
                length = int(await reader.readline())
                return await reader.readexactly(length)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            logger.info("gateway process %d did not answer %r: %s", index, name.decode(),
                        str(exc) or type(exc).__name__)
            return None
        finally:
            if writer is not None:
                writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        question = b""
        try:
            question = (await reader.readline())[:MAX_QUESTION_BYTES].strip()
            answer = self._answers.get(question)
            if answer is not None:
                body = await answer()
                writer.write(b"%d\n" % len(body) + body)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the asker gave up (its timeout); it leaves us out
        except Exception:
            logger.exception("answering a sibling's %r failed", question)
        finally:
            writer.close()
