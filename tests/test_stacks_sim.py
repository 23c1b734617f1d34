"""Stacks of a stalled engine, against real processes: the simulator's collective-hang scenario (its eight TP ranks
are processes blocked in functions placed like vLLM's) through the whole method, with secrets planted in the
launch's command line, which every py-spy dump prints; and py-spy itself against a process that holds a secret in
a local variable and on its command line."""

from __future__ import annotations

import asyncio
import gzip
import io
import secrets
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

from bot.bundle import export_bundle
from bot.store import Store
from demo.run import demo
from kernel.redact import redactor
from runner.stacks.dump import dump_pids
from tests.k3fixtures import SIM_SPEED
from tests.test_scenarios import STARTUP_HANG_SPEED
from vllm_sim.scenario import scenario_path

API_KEY = "ApiKeyStacks" + secrets.token_hex(8)
HF_TOKEN = "hf_" + secrets.token_hex(17)


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r:") as tar:
        return {info.name: (h.read() if (h := tar.extractfile(info)) else b"") for info in tar}


def _files(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


async def test_the_rank_hung_in_all_reduce_is_named_and_no_planted_secret_leaves(tmp_path: Path) -> None:
    text = scenario_path("collective-hang").read_text()
    scenario = tmp_path / "collective-hang.toml"
    scenario.write_text(
        text.replace("--kv-cache-dtype fp8", f"--kv-cache-dtype fp8 --api-key {API_KEY} --hf-token {HF_TOKEN}")
    )
    out = io.StringIO()
    report = await demo(tmp_path / "demo", scenario, STARTUP_HANG_SPEED, logs=True, out=out)
    printed = out.getvalue()
    error = report["first_error"]
    assert error["phase"] == "engine_init" and error["line"].startswith("hang: no progress in engine_init")
    assert error["stacks"][0].startswith("rank 5 differs: waits in all_reduce (pynccl.py:"), error["stacks"]
    assert "ranks 0-4, 6-7 wait in shm broadcast (acquire_read" in error["stacks"][0]
    assert sum(line.startswith("rank ") for line in error["stacks"][1:]) == 8  # every rank was dumped
    assert f"Where it waits: {error['stacks'][0]}" in printed  # the terminal shows the finding
    assert f"; where it waits: {error['stacks'][0]}" in report["verdict_line"]  # and the verdict says it first
    store = Store(tmp_path / "demo" / "k3repro.db")
    run = store.runs()[0]
    members = _members(export_bundle(store, run.id).to_bytes())
    raw = members["stacks/launch-1.txt"].decode()
    assert "Process " in raw and "PyNcclCommunicator.all_reduce" in raw and "MessageQueue.acquire_read" in raw
    assert "--api-key [REDACTED:" in raw  # the API server's command line, as py-spy printed it, redacted
    assert "Locals:" not in raw and "Arguments:" not in raw  # frames' variables are never dumped
    handoff = members["report.md"].decode()
    assert "Where it waits (py-spy, before the stop): rank 5 differs" in handoff
    store.close()
    places = {
        "printed": printed.encode(),
        "bundle": b"".join(members.values()),
        "store and journal": _files(tmp_path / "demo"),
    }
    leaks = [
        f"{name} in {place}" for place, data in places.items() for name in (API_KEY, HF_TOKEN) if name.encode() in data
    ]
    assert leaks == []


async def test_py_spy_shows_the_command_line_not_the_locals_and_the_redactor_hides_it(tmp_path: Path) -> None:
    local = "LocalSecret" + secrets.token_hex(8)
    script = tmp_path / "holder.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            def wait_with(token):
                held = {local!r}
                print("ready", flush=True)
                time.sleep(60)
            wait_with(sys.argv[-1])
            """
        )
    )
    process = subprocess.Popen(
        [sys.executable, str(script), "--api-key", API_KEY], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        [dump], [gone] = await asyncio.gather(dump_pids([process.pid], 5.0), dump_pids([2**22 + 7], 5.0))
    finally:
        process.kill()
        process.wait()
    assert "wait_with (holder.py:6)" in dump.text and local not in dump.text
    assert API_KEY in dump.text  # the hazard is real: py-spy prints the command line ...
    assert API_KEY not in redactor().line(dump.text)  # ... and the one redaction path hides it
    assert gone.text == "" and gone.error  # a process that is gone is reported, not raised


REQUEST_HANG = """description = "a request that never comes back: rank 2 stuck in all_reduce"
[deployment]
command = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 4 --trust-remote-code"
[[fault]]
id = "request-all-reduce"
phase = "request"
effect = "hang"
rank = 2
waits = "all_reduce"
"""


async def test_a_request_that_never_answers_is_dumped_before_the_engine_is_stopped(tmp_path: Path) -> None:
    scenario = tmp_path / "request-hang.toml"
    scenario.write_text(REQUEST_HANG)
    report = await demo(tmp_path / "demo", scenario, SIM_SPEED, logs=False, out=io.StringIO())
    error = report["first_error"]
    assert error["phase"] == "request" and error["line"].startswith("hang: no progress in request")
    assert error["stacks"][0].startswith("rank 2 differs: waits in all_reduce (pynccl.py:")
    assert "ranks 0-1, 3 wait in shm broadcast" in error["stacks"][0]
    assert "where it waits: rank 2 differs: waits in all_reduce" in report["verdict_line"]
