"""A one-line progress display for ``roundpipe-parity``, on a terminal only.

The line (``[3/18] forced_overflow (cpu), 12 s``) is redrawn in place with a carriage return
and erased when the run ends. It appears only once the run has taken ``delay`` seconds, so
short runs print nothing extra, and never when the stream is not a terminal (a pipe, a file,
a CI log), where carriage returns would only add noise.
"""

from __future__ import annotations

import time
from typing import Callable, TextIO

__all__ = ["Progress"]


class Progress:
    """Call it as ``progress(done, total, label)``; :meth:`close` erases the line."""

    def __init__(self, stream: TextIO, delay: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream, self._delay, self._clock = stream, delay, clock
        self._start = clock()
        self._enabled = bool(getattr(stream, "isatty", lambda: False)())
        self._shown = 0  # width of the line on screen

    def __call__(self, done: int, total: int, label: str) -> None:
        elapsed = self._clock() - self._start
        if not self._enabled or elapsed < self._delay:
            return
        line = f"roundpipe-parity: [{done + 1}/{total}] {label}, {elapsed:.0f} s"
        self._stream.write("\r" + line.ljust(self._shown))
        self._stream.flush()
        self._shown = len(line)

    def close(self) -> None:
        if self._shown:
            self._stream.write("\r" + " " * self._shown + "\r")
            self._stream.flush()
            self._shown = 0
