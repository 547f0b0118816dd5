"""A progress bar on stderr, without a dependency: one line redrawn in a terminal,
a line per 10 % otherwise (so CI logs stay short)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, *, total: int | None = None, duration: float | None = None,
                 enabled: bool = True, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.duration = duration
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.done = self.failed = 0
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._last_decile = -1
        self._tty = self.stream.isatty()

    def update(self, *, failed: bool) -> None:
        self.done += 1
        self.failed += int(failed)
        self._draw()

    def fraction(self) -> float:
        elapsed = time.monotonic() - self._started
        parts = []
        if self.total:
            parts.append(self.done / self.total)
        if self.duration:
            parts.append(elapsed / self.duration)
        return min(1.0, max(parts)) if parts else 0.0

    def _draw(self, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        fraction = self.fraction()
        if self._tty:
            if not force and now - self._last_draw < 0.2:
                return
            width = 30
            bar = "#" * int(fraction * width) + "-" * (width - int(fraction * width))
            self.stream.write(f"\r{self.label} [{bar}] {self._counts(now)}")
        else:
            decile = int(fraction * 10)
            if not force and decile == self._last_decile:
                return
            self._last_decile = decile
            self.stream.write(f"{self.label} {fraction:4.0%} {self._counts(now)}\n")
        self._last_draw = now
        self.stream.flush()

    def _counts(self, now: float) -> str:
        total = f"/{self.total}" if self.total else ""
        return f"{self.done}{total} done, {self.failed} failed, {now - self._started:5.1f}s"

    def close(self) -> None:
        if self.enabled:
            self._draw(force=True)
            if self._tty:
                self.stream.write("\n")
                self.stream.flush()
