"""The runner daemon over real gRPC on loopback with mTLS, running the real vllm-sim."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from bot.config import ClientTls
from bot.runner_client import open_channel
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from runner.config import parse_runner_config
from runner.daemon import RunnerDaemon
from tests.k3fixtures import KIMI_LAUNCH, runner_data, running_runner


def _tls(certs: DevCerts) -> ClientTls:
    return ClientTls(ca=certs.ca, cert=certs.bot_cert, key=certs.bot_key)


def _start(run_id: str, launch: str = KIMI_LAUNCH, image: str = "vllm/vllm-openai:kimi-k3") -> pb.StartRunRequest:
    return pb.StartRunRequest(run_id=run_id, cluster="cluster-a", image=image, launch_argv=launch.split())


def _minimize(**target: object) -> pb.StartRunRequest:
    """A minimize request whose trigger lacks what the runner needs to know the failure again."""
    request = _start("r1")
    fields = {"original_run_id": "r0", "step": "prefix_caching", "phase": pb.PHASE_REQUEST, "signature": "x"}
    request.minimize.CopyFrom(pb.Minimize(**{**fields, **target}))
    return request


async def test_describe_health_and_reflection_over_mtls(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path)) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            described = await pb_grpc.RunnerStub(channel).Describe(pb.DescribeRequest(), timeout=5)
            assert (described.name, described.cluster, described.backend) == ("gpu-test", "cluster-a", "sim")
            assert list(described.active_run_ids) == []
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="k3repro.v1.Runner"), timeout=5
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            answers = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            async for answer in answers:
                services = {s.name for s in answer.list_services_response.service}
                assert "k3repro.v1.Runner" in services and "grpc.health.v1.Health" in services
                break


async def test_client_without_certificate_is_refused(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path)) as daemon:
        no_cert = ClientTls(ca=certs.ca)
        async with open_channel(f"127.0.0.1:{daemon.port}", no_cert) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pb_grpc.RunnerStub(channel).Describe(pb.DescribeRequest(), timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        async with open_channel(f"127.0.0.1:{daemon.port}", None) as channel:  # plaintext to a TLS port
            with pytest.raises(grpc.aio.AioRpcError):
                await pb_grpc.RunnerStub(channel).Describe(pb.DescribeRequest(), timeout=5)


async def test_client_certificate_from_another_ca_is_refused(
    certs: DevCerts, other_certs: DevCerts, tmp_path: Path
) -> None:
    async with running_runner(runner_data(certs, tmp_path)) as daemon:
        stranger = ClientTls(ca=certs.ca, cert=other_certs.bot_cert, key=other_certs.bot_key)
        async with open_channel(f"127.0.0.1:{daemon.port}", stranger) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await pb_grpc.RunnerStub(channel).Describe(pb.DescribeRequest(), timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (
            _start("r1", KIMI_LAUNCH + " --bogus-flag 3"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unrecognized arguments: --bogus-flag",
        ),
        (_start("r1", image="evil/miner:latest"), grpc.StatusCode.PERMISSION_DENIED, "not allowlisted"),
        (_start("r1", launch="bash -c reboot"), grpc.StatusCode.INVALID_ARGUMENT, "must start with `vllm serve`"),
        (pb.StartRunRequest(run_id="r1", cluster="cluster-b"), grpc.StatusCode.INVALID_ARGUMENT, "serves cluster"),
        (
            pb.StartRunRequest(run_id="r1", cluster="cluster-a", image="vllm/vllm-openai:kimi-k3", profile="nope"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown baseline profile 'nope' (known: kimi-k3)",
        ),
        # the runner checks a minimize request itself (the bot refuses these first): a step the ladder does not
        # have, or a trigger without its phase or signature, could never be told from another failure
        *(
            (_minimize(**target), grpc.StatusCode.INVALID_ARGUMENT, "minimize needs the trigger step")
            for target in ({"step": "warp_drive"}, {"phase": pb.PHASE_UNSPECIFIED}, {"signature": ""})
        ),
    ],
)
async def test_bad_start_requests_are_refused_and_start_nothing(
    certs: DevCerts, tmp_path: Path, request_: pb.StartRunRequest, code: grpc.StatusCode, message: str
) -> None:
    async with running_runner(runner_data(certs, tmp_path)) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            stub = pb_grpc.RunnerStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.StartRun(request_, timeout=10):
                    pass
            assert caught.value.code() == code
            assert message in (caught.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                async for _ in stub.WatchRun(pb.WatchRunRequest(run_id="r1"), timeout=5):
                    pass
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert daemon.journal.unfinished_runs() == []


async def test_watch_replays_after_seq_and_matches_the_live_stream(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path, scenario="demo")) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            stub = pb_grpc.RunnerStub(channel)
            live = [e async for e in stub.StartRun(_start("r-replay"), timeout=60) if e.seq]
            assert [e.seq for e in live] == list(range(1, len(live) + 1))
            assert live[-1].WhichOneof("payload") == "run_finished"
            replay = [e async for e in stub.WatchRun(pb.WatchRunRequest(run_id="r-replay", after_seq=3), timeout=10)]
            assert replay == live[3:]


async def test_heartbeats_carry_seq_zero_while_a_run_is_quiet(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path, scenario="healthy", speed=5)) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            stub = pb_grpc.RunnerStub(channel)
            heartbeats: list[pb.RunEvent] = []
            async for event in stub.StartRun(_start("r-hb"), timeout=60):
                if event.WhichOneof("payload") == "heartbeat":
                    heartbeats.append(event)
                    if len(heartbeats) == 2:
                        break
            assert all(h.seq == 0 and h.heartbeat.last_seq >= 1 for h in heartbeats)
            assert heartbeats[-1].heartbeat.stage == pb.STAGE_MINIMAL_LAUNCH
            assert [e.seq for e in daemon.journal.events("r-hb", 0)] == list(
                range(1, daemon.journal.last_seq("r-hb") + 1)
            )


async def test_cancel_stops_the_engine_process_group(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path, scenario="healthy", speed=2)) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            stub = pb_grpc.RunnerStub(channel)
            events = stub.StartRun(_start("r-cancel"), timeout=60)
            async for event in events:
                if event.WhichOneof("payload") == "phase_reached":
                    break
            engine = daemon.hub.active["r-cancel"].context.session.engine
            pid = engine.pid  # type: ignore[union-attr]
            answer = await stub.CancelRun(pb.CancelRunRequest(run_id="r-cancel", requested_by="U123"), timeout=30)
            assert answer.cancelled
            rest = [e async for e in events if e.seq]
            finished_stages = [e.stage_finished for e in rest if e.HasField("stage_finished")]
            assert [(s.stage, s.status) for s in finished_stages] == [
                (pb.STAGE_MINIMAL_LAUNCH, pb.STAGE_STATUS_CANCELLED)
            ]
            assert rest[-1].run_finished.status == pb.RUN_STATUS_CANCELLED
            assert "U123" in rest[-1].run_finished.summary
            await asyncio.sleep(0.1)
            with pytest.raises(ProcessLookupError):
                os.killpg(pid, 0)
            again = await stub.CancelRun(pb.CancelRunRequest(run_id="r-cancel"), timeout=5)
            assert not again.cancelled


async def test_a_second_run_on_a_busy_runner_is_refused(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path, scenario="healthy", speed=2)) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            stub = pb_grpc.RunnerStub(channel)
            first = stub.StartRun(_start("r-a"), timeout=60)
            await anext(aiter(first))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.StartRun(_start("r-b"), timeout=10):
                    pass
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "busy with run r-a" in (caught.value.details() or "")
            first.cancel()


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_start("../../etc/passwd"), "run_id must be 1-64 letters"),
        (_start("r" * 65), "run_id must be 1-64 letters"),
        (_start("r-big", KIMI_LAUNCH + " --seed 1" * 300), "over 512 arguments"),
        (
            pb.StartRunRequest(
                run_id="r-body",
                cluster="cluster-a",
                image="vllm/vllm-openai:kimi-k3",
                launch_argv=KIMI_LAUNCH.split(),
                request=pb.FixedRequest(body_json='{"prompt": "' + "x" * 300_000 + '"}'),
            ),
            "request body is over 256 KiB",
        ),
    ],
)
async def test_oversized_or_malformed_requests_are_refused(
    certs: DevCerts, tmp_path: Path, request_: pb.StartRunRequest, message: str
) -> None:
    async with running_runner(runner_data(certs, tmp_path)) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in pb_grpc.RunnerStub(channel).StartRun(request_, timeout=10):
                    pass
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (caught.value.details() or "")
        assert daemon.journal.unfinished_runs() == [] and not daemon.hub.active


async def test_shutdown_reports_not_serving_then_cancels_runs(certs: DevCerts, tmp_path: Path) -> None:
    data = runner_data(certs, tmp_path, scenario="healthy", speed=1)
    daemon = RunnerDaemon(parse_runner_config(data, base=tmp_path, origin="test"))
    await daemon.start()
    async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="k3repro.v1.Runner"))
        assert (await anext(aiter(watch))).status == health_pb2.HealthCheckResponse.SERVING
        events = pb_grpc.RunnerStub(channel).StartRun(_start("r-shut"), timeout=60)
        await anext(aiter(events))
        stopping = asyncio.create_task(daemon.stop("runner shutting down (SIGTERM)", grace_s=2))
        assert (await anext(aiter(watch))).status == health_pb2.HealthCheckResponse.NOT_SERVING
        rest = [e async for e in events if e.seq]
        await stopping
    assert rest[-1].run_finished.status == pb.RUN_STATUS_CANCELLED
    assert rest[-1].run_finished.summary == "runner shutting down (SIGTERM)"
