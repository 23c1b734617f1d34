"""A progress line on stderr for a long analysis (`k3repro analyze`, `start --log`): an engineer who hands a
500 MB log over sees it move instead of a silent minute. Nothing for a short one; never on stdout."""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from kernel.clock import WALL

_MIB = 1 << 20


class ProgressLine:
    """Called with (bytes done, bytes in all or None): after `delay_s`, on a terminal one line redrawn in place
    (and erased at the end), else one plain line every `every_s` (a log file or CI output is not flooded)."""

    def __init__(
        self,
        label: str,
        out: TextIO,
        *,
        delay_s: float = 2.0,
        every_s: float = 10.0,
        clock: Callable[[], float] = WALL.monotonic,
    ) -> None:
        self._label = label
        self._out = out
        self._tty = out.isatty()
        self._clock = clock
        self._start = clock()
        self._delay_s = delay_s
        self._every_s = 0.25 if self._tty else every_s
        self._last = -float("inf")
        self._drawn = False

    def __call__(self, done: int, total: int | None) -> None:
        now = self._clock()
        if now - self._start < self._delay_s or now - self._last < self._every_s:
            return
        self._last = now
        rate = done / _MIB / max(now - self._start, 1e-9)
        amount = f"{done / _MIB:,.0f} MiB read" if total is None else f"{done / _MIB:,.0f} of {total / _MIB:,.0f} MiB"
        text = f"{self._label}: {amount} ({rate:,.0f} MiB/s)"
        if self._tty:
            self._out.write(f"\r{text}\x1b[K")
            self._drawn = True
        else:
            self._out.write(text + "\n")
        self._out.flush()

    def close(self) -> None:
        """Erase the redrawn line, so what follows starts on a clean line."""
        if self._drawn:
            self._out.write("\r\x1b[K")
            self._out.flush()
            self._drawn = False

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
