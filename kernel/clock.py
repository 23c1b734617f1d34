"""The clock the runner waits on the engine with: the engine's own time, given by the engine backend.

A real engine (process, docker) lives on the wall clock. The simulator runs `speed` times faster, so the sim
backend's clock does too: the runner and the engine it follows then count the same seconds, and
`ready_timeout_s`, `stall_timeout_s`, `request_timeout_s` and every wait below mean seconds of engine time
whichever backend runs. Stage logic only ever uses `ctx.clock`. What faces the bot (heartbeats, the daemon's
grace, the journal) stays on the wall clock.

`WallClock` is that wall clock, the one "now" of each side: the runner's journal, retention and fingerprints,
the bot's store timestamps, outbox back-off, Slack access windows and isolation polls. This module is the only
production code that reads the system's time (tests/test_one_clock.py holds every other to it), so a test fakes
time by handing a component another `WallClock`, never by patching `time`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

JITTER_S = 1.0  # the wall seconds a scaled clock's limits allow for a loaded machine not scheduling a process
POLL_FLOOR_S = 0.02  # the shortest wall interval between two looks: looking costs the machine's time, not the engine's


class WallClock:
    """The wall clock of one side. Each process is one side and has one, `WALL`; a component whose time a test
    controls takes it as `clock` (defaulting to `WALL`), and a subclass that overrides `now`, `monotonic` and
    `sleep` fakes it whole (`utc` and `stamp` derive from `now`)."""

    def now(self) -> float:
        """Seconds since the epoch (what a stored time or a deadline kept across restarts is in)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds that never go back (what an interval, a pace or a deadline within this process is in)."""
        return time.monotonic()

    def utc(self) -> datetime:
        """Now as an aware UTC datetime."""
        return datetime.fromtimestamp(self.now(), UTC)

    def stamp(self, timespec: str = "milliseconds") -> str:
        """Now as ISO 8601 UTC text (the stores' and the journal's timestamps, which sort as text)."""
        return self.utc().isoformat(timespec=timespec)

    async def sleep(self, seconds: float) -> None:
        """Waits `seconds` of this clock (a poll, a back-off)."""
        await asyncio.sleep(seconds)

    def pause(self, seconds: float) -> None:
        """Blocks the calling thread `seconds` of this clock (a poll in code that runs off the event loop)."""
        time.sleep(seconds)


WALL = WallClock()  # the side's one wall clock: every process is one side (the runner daemon or the bot)


@dataclass(frozen=True)
class Clock:
    """`speed` times the wall clock; `Clock()` is the wall clock itself, `Clock.scaled(speed)` the simulator's.

    Three kinds of waits. A pause (a settle) lasts exactly its clock seconds. A poll (how often the runner looks:
    for readiness, for a log chunk to send, for leftover memory to drain) lasts its clock seconds but never under
    POLL_FLOOR_S of the wall clock: looking costs the machine's time, and at speed 2000 a 0.25 s poll would be a
    busy loop starving the engine it waits for. A limit, whose end is read as news about the engine (a ready
    deadline, a stall or request time-out, the moment a failed answer gives the log to show why, a stop's grace, a
    drain), lasts its clock seconds plus `slack_s` of the wall clock: scheduling jitter is wall time, added to
    whatever the engine does, and at speed 200 half a second of a loaded machine not running the simulator is
    100 s of engine time that must not read as a hang. The wall clock needs no slack (its limits are minutes, a
    stall is a rounding error).
    """

    speed: float = 1.0
    slack_s: float = 0.0

    @classmethod
    def scaled(cls, speed: float) -> Clock:
        return cls(speed, JITTER_S if speed != 1 else 0.0)

    def now(self) -> float:
        """Monotonic seconds of this clock."""
        return time.monotonic() * self.speed

    def limit(self, seconds: float) -> float:
        """The clock seconds a limit of `seconds` lasts: its own, plus the slack for jitter."""
        return seconds + self.slack_s * self.speed

    def wall(self, seconds: float) -> float:
        """`seconds` of this clock in wall seconds (what a library's own time-out takes)."""
        return seconds / self.speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, self.wall(seconds)))

    async def poll(self, seconds: float, futures: Iterable[asyncio.Future[Any]] = ()) -> bool:
        """Waits `seconds` of this clock between two looks, never under POLL_FLOOR_S of the wall clock (or until
        one of `futures`); True when one is done."""
        pending = list(futures)
        interval = max(POLL_FLOOR_S, self.wall(seconds))
        if not pending:
            await asyncio.sleep(interval)
            return False
        done, _ = await asyncio.wait(pending, timeout=interval)
        return bool(done)

    async def wait(self, futures: Iterable[asyncio.Future[Any]], seconds: float) -> bool:
        """Waits up to `seconds` of this clock for one of `futures`; True when one is done."""
        done, _ = await asyncio.wait(futures, timeout=max(0.0, self.wall(seconds)))
        return bool(done)
