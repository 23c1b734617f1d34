"""Simulated time: it runs VLLM_SIM_SPEED times faster than the wall clock.

Log timestamps and the durations printed in messages read as they would at speed 1, so a start-up that
takes 0.5 s in a test still looks like a two-minute vLLM start-up to whoever reads the log.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta


class SimClock:
    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._wall_start = datetime.now().astimezone()
        self._mono_start = time.monotonic()

    def elapsed(self) -> float:
        """Simulated seconds since the simulator started."""
        return (time.monotonic() - self._mono_start) * self.speed

    def now(self) -> datetime:
        return self._wall_start + timedelta(seconds=self.elapsed())

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds / self.speed)

    async def sleep_until(self, elapsed: float) -> None:
        """Sleeps to an absolute simulated time, so many small steps do not add up drift."""
        await self.sleep(elapsed - self.elapsed())
