"""Identical runs give identical verdicts under load: the same sim scenario run N times at once through one runner
(max_concurrent_runs raised) ends with one verdict signature: decision, reasons, ladder outcomes, first error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from bot.runner_client import ClientTls, open_channel
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from tests.k3fixtures import KIMI_LAUNCH, runner_data, running_runner

pytestmark = pytest.mark.sim

RUNS = int(os.environ.get("K3REPRO_LOAD_RUNS", "12"))  # as many as a 2-core machine bears in well under a minute


def signature(events: list[pb.RunEvent]) -> str:
    """What a verdict is, without its times, ports and run ids."""
    finished = events[-1].run_finished
    ladder = [
        (e.ladder_step.step, e.ladder_step.outcome, e.ladder_step.signature, e.ladder_step.relaunched)
        for e in events
        if e.HasField("ladder_step")
    ]
    errors = [e.first_error.signature for e in events if e.HasField("first_error")]
    return json.dumps(
        {
            "status": finished.status,
            "decision": finished.decision,
            "reasons": list(finished.reasons),
            "ladder": ladder,
            "first_error": errors[:1],
            "launches": finished.launches,
        }
    )


async def _one(stub: pb_grpc.RunnerStub, number: int) -> list[pb.RunEvent]:
    request = pb.StartRunRequest(
        run_id=f"load-{number}",
        cluster="cluster-a",
        image="vllm/vllm-openai:kimi-k3",
        launch_argv=KIMI_LAUNCH.split(),
        request=pb.FixedRequest(
            api="chat", repeats=3, body_json=json.dumps({"messages": [{"role": "user", "content": "hi"}]})
        ),
        profile="kimi-k3",
    )
    return [e async for e in stub.StartRun(request, timeout=120, wait_for_ready=True) if e.seq]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scenario", ["healthy"])
async def test_identical_runs_at_once_give_one_verdict(certs: DevCerts, tmp_path: Path, scenario: str) -> None:
    """One runner per run, as K GPU hosts: a runner's own concurrent runs share its GPUs (each other's engines
    are memory held by other processes, which rightly changes the verdict)."""
    tls = ClientTls(ca=certs.ca, cert=certs.bot_cert, key=certs.bot_key)
    async with contextlib.AsyncExitStack() as stack:
        daemons = [
            await stack.enter_async_context(running_runner(runner_data(certs, tmp_path / f"r{n}", scenario=scenario)))
            for n in range(RUNS)
        ]
        channels = [await stack.enter_async_context(open_channel(f"127.0.0.1:{d.port}", tls)) for d in daemons]
        runs = await asyncio.gather(*(_one(pb_grpc.RunnerStub(c), n) for n, c in enumerate(channels)))
    signatures = Counter(signature(events) for events in runs)
    assert all(events[-1].HasField("run_finished") for events in runs)
    assert len(signatures) == 1, "\n".join(f"{count}x {sig}" for sig, count in signatures.items())
