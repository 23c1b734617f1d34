"""A real vLLM (the CPU build) start-up that really hangs, dumped before it is stopped: a tiny model whose
`--trust-remote-code` configuration code sleeps when vLLM's engine core imports it (devtools/make_model.py
--remote-code-sleep). The runner's stall limit cuts the launch short; py-spy finds the engine core in the remote
code, the worker in the shared-memory broadcast and the API server waiting for the engine, and the finding says so.

The run is cancelled once the finding arrived (its relaunch would only show the same), so the test takes the
launch up to the hang, the stall limit and the dumps.

The log alone says nothing: its last line is vLLM's own "init engine (profile, create kv cache, warmup model)
took …", after which the engine core imports the remote code (for the tokenizer of its structured-output manager)
and sleeps; the analyzer places the hang where the log stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from tests.k3fixtures import bot_core
from tests.real_vllm_method import IMAGE, REQUEST, launch_line, runner_settings

pytestmark = pytest.mark.timeout(300)
# Longer than any silence of a healthy start-up before the hang (the engine core's and the worker's imports, ~15 s
# each on a loaded machine), short enough to keep the test brief.
STALL_S = 40


async def test_a_launch_hung_in_remote_code_is_dumped_and_named_where_it_sleeps(
    certs: DevCerts, tmp_path: Path, vllm_env: dict[str, str], vllm_models: dict[str, Path]
) -> None:
    sleeping_model = vllm_models["remote-sleep"]  # made with --remote-code-sleep 600
    settings = runner_settings(tmp_path / "runner", certs)
    settings["engine"]["stall_timeout_s"] = STALL_S
    launch = launch_line(sleeping_model, "--trust-remote-code", "--enforce-eager")  # no compiled warm-up: sooner
    found: list[pb.FirstError] = []
    async with bot_core(certs, tmp_path, settings, image=IMAGE, launch=launch, request=REQUEST) as core:
        started = await core.start("cluster-a", "U1")
        cancels: list[asyncio.Task[object]] = []

        async def watch(event: pb.RunEvent) -> None:
            if event.HasField("first_error") and not found:
                found.append(event.first_error)
                cancels.append(asyncio.create_task(core.cancel(started.run_id, "U1")))  # the finding is in

        await core.follow(started, watch)
        await asyncio.gather(*cancels)
    assert found, "the launch never stalled"
    error = found[0]
    assert error.line.startswith("hang: no progress in ") and error.category == pb.ERROR_CATEGORY_OTHER, error
    headline, processes = error.stacks[0], list(error.stacks[1:])
    assert headline.startswith("engine core: sleeping in remote code (configuration_k3sleep.py:"), error.stacks
    assert any(p.startswith("engine core (pid ") and "sleeping in remote code" in p for p in processes), processes
    assert any(p.startswith("worker (pid ") and "waits in shm broadcast (acquire_read" in p for p in processes)
    assert any(p.startswith("API server (pid ") and "waits for a message" in p for p in processes), processes
