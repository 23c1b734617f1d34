"""Engine output can neither blind nor stall the runner: real engines (subprocesses) writing over-long lines,
floods and stray processes, read through the process backend, the log follower and real gRPC on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

import vllm_sim
from bot.runner_client import CHANNEL_OPTIONS, open_channel
from kernel.clock import Clock
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from protos.limits import LOG_CHUNK_BYTES, MAX_MESSAGE_BYTES, MESSAGE_OPTIONS
from runner.config import resolve_executable
from runner.daemon import SERVER_OPTIONS
from runner.engines.lines import LINE_LIMIT, LineSplitter
from runner.engines.process import LAUNCH_ENV, RUN_ID_ENV, ProcessBackend, ProcessEngine
from runner.stages.log_follower import LogFollower
from tests.k3fixtures import bot_core, runner_data
from vllm_sim.backend import SimBackend

PYTHON = str(resolve_executable(sys.executable))
SCENARIOS = Path(vllm_sim.__file__).parent / "data" / "scenarios"
BURST = "INFO:     burst "  # uvicorn's prefix: a line the analyzer reads fast
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB"
ERROR = f"(EngineCore_DP0 pid=9) ERROR 12-03 10:00:01 [core.py:700] {OOM}"


def _backend(speed: float = 1) -> ProcessBackend:
    return ProcessBackend(executables=(PYTHON,), clock=Clock.scaled(speed))


async def _launch(script: str, run_id: str = "r-out", speed: float = 1) -> ProcessEngine:
    return await _backend(speed).launch([sys.executable, "-c", script], run_id=run_id, image="")


async def _all_lines(engine: ProcessEngine, timeout_s: float = 5) -> list[tuple[str, str]]:
    async def read() -> list[tuple[str, str]]:
        return [(line.stream, line.text) async for line in engine.lines()]

    return await asyncio.wait_for(read(), timeout_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"
    return False


def test_the_splitter_keeps_the_head_of_a_long_line_and_the_lines_after_it() -> None:
    splitter = LineSplitter()
    data = b"a\r\nb" + b"x" * (3 * LINE_LIMIT) + b"\nc\nd"
    lines = [text for i in range(0, len(data), 1000) for text in splitter.feed(data[i : i + 1000])]
    lines += splitter.close()
    assert lines[0] == "a" and lines[2:] == ["c", "d"]
    assert lines[1].startswith("b" + "x" * (LINE_LIMIT - 1) + " [k3repro: ")
    assert f"{2 * LINE_LIMIT + 1} more bytes of this line dropped" in lines[1]
    assert splitter.close() == []


def test_the_splitter_is_linear_in_what_it_reads() -> None:
    """8 MiB without a newline in 256-byte pieces (a chatty container's frames): joining what waits and splitting
    it again at each piece took seconds per MiB; each byte is now looked at once."""
    splitter = LineSplitter()
    piece = b"y" * 256
    started = time.perf_counter()
    out = [text for _ in range(8 * 4096) for text in splitter.feed(piece)]
    out += splitter.feed(b"\nnext\n")
    assert time.perf_counter() - started < 1.0
    assert len(out) == 2 and out[1] == "next" and f"{8 * 1024 * 1024 - LINE_LIMIT} more bytes" in out[0]


async def test_a_line_over_the_limit_is_cut_and_the_stream_read_on() -> None:
    """A 2 MiB line without a newline, then the engine's error, then 8 MiB more: the error is delivered, the
    flood is read (the engine never blocks in write()), and the engine exits."""
    script = (
        "import sys; w = sys.stdout.write; w('x' * (2 << 20)); w('\\n'); "
        f"w({ERROR!r} + '\\n'); w(('z' * 1023 + '\\n') * 8192); w('last'); sys.stdout.flush()"
    )
    started = time.monotonic()
    engine = await _launch(script)
    lines = await _all_lines(engine)
    assert await engine.wait() == 0 and time.monotonic() - started < 4
    texts = [text for _, text in lines]
    assert texts[0].startswith("x" * LINE_LIMIT + " [k3repro: ") and f"{(2 << 20) - LINE_LIMIT} more bytes" in texts[0]
    assert texts[1] == ERROR and texts[-1] == "last" and len(texts) == 8195
    assert max(len(text) for text in texts) < LINE_LIMIT + 200


async def test_the_analyzer_sees_the_error_after_an_over_long_line() -> None:
    """The over-long line is not "the first error": the real one, on the next line, is."""
    engine = await _launch(f"import sys, time; print('x' * (3 << 20)); print({ERROR!r}, flush=True); time.sleep(30)")

    async def emit(**_: object) -> pb.RunEvent:
        return pb.RunEvent()

    async def serving() -> bool:
        return False

    follower = LogFollower(engine, emit, "test", Clock(), serving)
    try:
        error = await asyncio.wait_for(asyncio.shield(follower.first_error), 4)
        assert error.line == ERROR and error.category == "oom"
    finally:
        await engine.stop(1)
        await follower.drain(2)
    assert follower.ended


async def test_stop_kills_a_process_that_left_the_group_and_does_not_wait_on_its_pipe() -> None:
    """The engine starts a process in a session of its own (setsid) that keeps the engine's stdout: stop kills
    it too (the launch's marker finds it), and returns without waiting on the pipe it held."""
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
        "print(p.pid, flush=True); time.sleep(60)"
    )
    engine = await _launch(script)
    stray = int((await anext(engine.lines())).text)
    assert _alive(stray) and os.getpgid(stray) != engine.pid
    started = time.monotonic()
    await asyncio.wait_for(engine.stop(grace_s=1), 4)
    assert time.monotonic() - started < 2
    await _all_lines(engine, 1)  # the output ended
    deadline = time.monotonic() + 2
    while _alive(stray) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not _alive(stray)


async def test_an_engine_that_exits_leaves_no_stray_process_holding_its_output() -> None:
    """The engine exits by itself, its setsid child still holding stdout: the output ends anyway (a crash is
    seen as a crash, not a hang) and the child is killed. The engine's clock runs 10x (the grace is engine time)."""
    script = (
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
        "print(p.pid, flush=True); print('Traceback: the engine died', flush=True); sys.exit(3)"
    )
    engine = await _launch(script, speed=10)
    started = time.monotonic()
    lines = await _all_lines(engine, 4)
    stray = int(lines[0][1])
    assert lines[1:] == [("stdout", "Traceback: the engine died")] and await engine.wait() == 3
    assert time.monotonic() - started < 3.5
    deadline = time.monotonic() + 2
    while _alive(stray) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not _alive(stray)


async def test_the_engine_gets_an_allowlisted_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's credentials never reach the engine; what vLLM needs does."""
    passed = {
        "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "HUGGING_FACE_HUB_TOKEN": "hf_x",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/i", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "4", "PYTHONHASHSEED": "0",
    }  # fmt: skip
    kept_back = {"SLACK_BOT_TOKEN": "xoxb-1-2-3", "SLACK_APP_TOKEN": "xapp-1", "AWS_SECRET_ACCESS_KEY": "k",
                 "K3REPRO_REDACT_KEY": "r", "K3REPRO_STATE": "x"}  # fmt: skip
    for name, value in {**passed, **kept_back}.items():
        monkeypatch.setenv(name, value)
    engine = await _launch("import json, os; print(json.dumps(dict(os.environ)))", run_id="r-env")
    (line,) = await _all_lines(engine)
    env = json.loads(line[1])
    assert {name: env.get(name) for name in passed} == passed
    assert not set(kept_back) & set(env)
    assert env[RUN_ID_ENV] == "r-env" and env[LAUNCH_ENV].startswith("r-env.") and env["PATH"] == os.environ["PATH"]
    sim = SimBackend("", speed=100).environment("r-sim")  # the simulator's own variables are added after
    assert sim["VLLM_SIM_SPEED"] == "100" and sim["VLLM_SIM_LAUNCH"] == "1" and "SLACK_BOT_TOKEN" not in sim


def _bursting_vllm(folder: Path, lines: int, width: int) -> Path:
    """A `vllm` that first writes a burst (one chunk's worth of lines, wider than gRPC's 4 MiB default in all),
    then runs as vllm-sim does on the demo scenario (it fails in gpu_detect, twice: a short run); the burst
    comes at the run's first launch only."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "vllm"
    program.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"flag = {str(folder / 'burst-done')!r}\n"
        "if not os.path.exists(flag):\n"
        "    open(flag, 'w').close()\n"
        f"    sys.stderr.write(''.join(f'{BURST}{{i:03d}} ' + 'b' * {width} + '\\n' for i in range({lines})))\n"
        "    sys.stderr.flush()\n"
        f"os.environ.update(VLLM_SIM_SPEED='10000', VLLM_SIM_SCENARIO={str(SCENARIOS / 'demo.toml')!r})\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'vllm_sim', 'serve', *sys.argv[2:]])\n"
    )
    program.chmod(0o755)
    return program


async def test_a_burst_over_grpcs_default_limit_reaches_the_bot_and_watch(
    certs: DevCerts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """70 lines of 62 KB at once (4.3 MB, read within the log's 1 s chunk interval: one log chunk before, over
    gRPC's 4 MiB default): the run completes through the bot core (it was recorded as lost), and watching it again
    from its first event works. Most of its time is the redaction of the burst (~0.5 s a MB here)."""
    lines, width = 70, 62_000
    program = _bursting_vllm(tmp_path / "bin", lines, width)
    monkeypatch.setenv("PATH", f"{program.parent}{os.pathsep}{os.environ['PATH']}")
    data = runner_data(certs, tmp_path / "runner")
    data["engine"] = {"backend": "process", "executables": [str(program)], "stop_grace_s": 1}
    async with bot_core(certs, tmp_path, data) as core:
        started = await core.start("cluster-a", "U1")
        events: list[pb.RunEvent] = []

        async def keep(event: pb.RunEvent) -> None:
            events.append(event)

        finished = await core.follow(started, keep)
        assert finished.status == pb.RUN_STATUS_COMPLETED, finished.summary
        burst = [text for e in events if e.HasField("log_chunk") for text in e.log_chunk.lines if BURST in text]
        assert len(burst) == lines and all(len(text) == len(BURST) + 4 + width for text in burst)
        chunks = [e.log_chunk for e in events if e.HasField("log_chunk")]
        assert max(e.ByteSize() for e in events) <= LOG_CHUNK_BYTES + 1024 < MAX_MESSAGE_BYTES
        assert sum(any(BURST in t for t in c.lines) for c in chunks) >= 5  # cut under the limit
        (runner,) = core.config.clusters["cluster-a"].runners
        async with open_channel(runner, core.config.tls) as channel:  # `watch` from the first event
            stub = pb_grpc.RunnerStub(channel)
            replay = [e async for e in stub.WatchRun(pb.WatchRunRequest(run_id=started.run_id), timeout=20) if e.seq]
        assert [e.seq for e in replay] == [e.seq for e in events if e.seq]
        assert replay[-1].run_finished.status == pb.RUN_STATUS_COMPLETED
        watched = await core.resume(started.run_id, keep)
        assert watched.status == pb.RUN_STATUS_COMPLETED


def test_both_sides_set_the_same_message_limits() -> None:
    """A message the runner may send is one the bot's channels receive (and the other way round)."""
    assert set(MESSAGE_OPTIONS) <= set(SERVER_OPTIONS) and set(MESSAGE_OPTIONS) <= set(CHANNEL_OPTIONS)
    assert dict(MESSAGE_OPTIONS) == {
        "grpc.max_send_message_length": MAX_MESSAGE_BYTES, "grpc.max_receive_message_length": MAX_MESSAGE_BYTES
    }  # fmt: skip
    assert LOG_CHUNK_BYTES + LINE_LIMIT * 2 < MAX_MESSAGE_BYTES // 4  # room for redaction and the event around it
