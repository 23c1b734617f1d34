"""The log follower on a real process's pipes: the warnings logged before an answer are read before the
request's result is made, without a fixed sleep when the access log shows the answer."""

from __future__ import annotations

import asyncio
import sys
import time

from protos import runner_pb2 as pb
from runner.clock import Clock
from runner.engines.process import ProcessEngine
from runner.stages.log_follower import LogFollower

WARNING = "(APIServer pid=7) WARNING 12-03 10:00:00 [serving.py:1] the request asked for a removed field"
ACCESS = 'INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK'


async def _follow(script: str) -> tuple[LogFollower, ProcessEngine]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # as the process backend launches: stop signals the group
    )
    engine = ProcessEngine(process, Clock())

    async def emit(**_: object) -> pb.RunEvent:
        return pb.RunEvent()

    return LogFollower(engine, emit, "test", Clock()), engine


async def test_an_answer_in_the_access_log_ends_the_wait_with_the_warnings_before_it_read() -> None:
    follower, engine = await _follow(
        f"import time; print({WARNING!r}, flush=True); time.sleep(0.3); print({ACCESS!r}, flush=True); time.sleep(5)"
    )
    seen = follower.answered("/v1/chat/completions")
    started = time.monotonic()
    await follower.until_answered("/v1/chat/completions", seen, 3.0)
    waited = time.monotonic() - started
    assert 0.1 < waited < 2.0  # until the access line came (0.3 s after the warning), not the whole limit
    assert follower.answered("/v1/chat/completions") == seen + 1 and follower.warnings == [WARNING]
    await follower.until_answered("/v1/completions", 0, 0.2)  # another path's answer is not this one's
    assert follower.answered("/v1/completions") == 0
    await engine.stop(1)
    await follower.drain(2)


async def test_without_an_access_line_the_wait_is_the_whole_limit() -> None:
    follower, engine = await _follow(f"import time; print({WARNING!r}, flush=True); time.sleep(5)")
    started = time.monotonic()
    await follower.until_answered("/v1/chat/completions", 0, 0.3)
    assert time.monotonic() - started >= 0.29 and follower.warnings == [WARNING]
    await engine.stop(1)
    await follower.drain(2)
