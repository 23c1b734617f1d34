"""The log follower on a real process's pipes: the warnings logged before an answer are read before the
request's result is made, without a fixed sleep when the access log shows the answer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time

import pytest

from kernel.clock import Clock
from protos import runner_pb2 as pb
from runner.engines.process import ProcessEngine
from runner.stages.log_follower import ACCESS_LINE, ERROR_WAIT_S, LogFollower

WARNING = "(APIServer pid=7) WARNING 12-03 10:00:00 [serving.py:1] the request asked for a removed field"
ACCESS = 'INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK'


async def _follow(script: str, serving: bool = True) -> tuple[LogFollower, ProcessEngine]:
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

    async def answers_health() -> bool:
        return serving

    return LogFollower(engine, emit, "test", Clock(), answers_health), engine


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


TRACEBACK = [
    "(APIServer pid=7) ERROR 12-03 10:00:01 [serving.py:1284] Error in chat completion stream generator.",
    "(APIServer pid=7) ERROR 12-03 10:00:01 [serving.py:1284] Traceback (most recent call last):",
    '(APIServer pid=7) ERROR 12-03 10:00:01 [serving.py:1284]   File "/vllm/entrypoints/openai/serving_chat.py", line 9, in g',
    "(APIServer pid=7) ERROR 12-03 10:00:01 [serving.py:1284]     raise ValueError(msg)",
    "(APIServer pid=7) ERROR 12-03 10:00:01 [serving.py:1284] ValueError: kimi_k2 tool parser: unexpected token",
]
FAILED_ACCESS = 'INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error'


@pytest.mark.parametrize("goes_on", [True, False])
async def test_a_failed_answer_the_server_survived_settles_its_traceback_at_once(goes_on: bool) -> None:
    """A 500 the access log showed, from a server still answering /health: every line of that request has been
    read and nothing settles the traceback, so waiting longer only costs time. A server that stopped answering
    may still be logging (another process's error, its death): it gets the whole moment."""
    lines = [*TRACEBACK, FAILED_ACCESS]
    follower, engine = await _follow(f"import time; print('\\n'.join({lines!r}), flush=True); time.sleep(10)", goes_on)
    await follower.until_answered("/v1/chat/completions", 0, 3.0)
    started = time.monotonic()
    await follower.wait_first_error()
    waited = time.monotonic() - started
    assert follower.first_error.done() and follower.first_error.result().line == TRACEBACK[-1]
    assert waited < 0.5 if goes_on else waited >= ERROR_WAIT_S - 0.05
    await engine.stop(1)
    await follower.drain(2)


async def test_a_traceback_the_log_ended_on_is_the_first_error_not_a_hang() -> None:
    """The engine printed a traceback the analyzer still holds open (no later line ended it) and then fell
    silent: when the silence reaches the stall limit before the quiet settle, the traceback is the finding."""
    follower, engine = await _follow(f"import time; print('\\n'.join({TRACEBACK!r}), flush=True); time.sleep(10)")
    deadline = time.monotonic() + 5
    while follower.lines_read < len(TRACEBACK) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert follower.lines_read == len(TRACEBACK) and not follower.first_error.done()  # held open, not settled yet
    assert follower.analyzer.stalled(now=1e9, threshold_s=1.0) is not None  # the analyzer alone sees only silence
    assert await follower.stalled(now=1e9, threshold_s=1.0) is None
    assert follower.first_error.done() and follower.first_error.result().line == TRACEBACK[-1]
    await engine.stop(1)
    await follower.drain(2)


async def test_a_stop_cancelled_during_its_grace_still_kills_the_group() -> None:
    """A run cancelled while its engine is being stopped must not leave the engine (or its children) alive."""
    _, engine = await _follow(
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(child.pid, flush=True); time.sleep(60)"
    )
    child = int((await anext(engine.lines())).text)
    stopping = asyncio.create_task(engine.stop(grace_s=30))  # it ignores SIGTERM: the grace would run out
    await asyncio.sleep(0.2)
    stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    deadline = time.monotonic() + 5
    while (engine.returncode is None or _alive(child)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert engine.returncode == -signal.SIGKILL and not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"  # a zombie waiting for its parent's wait() is gone
    return False


def test_the_access_line_pattern_is_linear_on_a_long_line() -> None:
    """A 64 KiB line of non-spaces after `"GET /` (what an engine pump may hand over) is read in linear time."""
    started = time.process_time()
    assert ACCESS_LINE.search('"GET /' + "x" * 65536) is None
    assert time.process_time() - started < 0.1
    found = ACCESS_LINE.search('INFO:     127.0.0.1:5 - "POST /v1/chat/completions?x=1 HTTP/1.1" 200 OK')
    assert found is not None and (found["path"], found["status"]) == ("/v1/chat/completions", "200")
