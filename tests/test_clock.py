"""The runner's clock: a poll on a fast simulator is never a busy loop; a limit keeps its wall slack."""

from __future__ import annotations

import asyncio
import time

from kernel.clock import JITTER_S, POLL_FLOOR_S, Clock


async def test_a_poll_on_a_fast_clock_waits_at_least_the_floor() -> None:
    fast = Clock.scaled(2000)
    started = time.monotonic()
    for _ in range(5):
        assert await fast.poll(0.25) is False  # 0.125 ms of wall time, were it not for the floor
    assert time.monotonic() - started >= 5 * POLL_FLOOR_S * 0.9


async def test_a_poll_on_the_wall_clock_lasts_its_own_seconds_and_ends_when_a_future_does() -> None:
    wall = Clock()
    started = time.monotonic()
    assert await wall.poll(0.1) is False
    assert time.monotonic() - started >= 0.09
    done = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, done.set_result, None)
    started = time.monotonic()
    assert await wall.poll(5.0, [done]) is True
    assert time.monotonic() - started < 1.0


def test_a_limit_on_a_scaled_clock_keeps_its_wall_slack() -> None:
    assert Clock.scaled(200).limit(120) == 120 + JITTER_S * 200
    assert Clock().limit(120) == 120
    assert Clock.scaled(2000).wall(2000) == 1.0
