"""`k3repro show RUN --timeline FILE`: a run's launches drawn from its stored events, after a real run of a sim
scenario through the bot core; and the launches of a hand-built stream (a proxy, an update of the same first
error, a failure before any phase)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from matplotlib.image import imread

from bot.cli import main
from bot.coordinator import Coordinator
from bot.store import AsyncStore, Store
from kernel.launches import LaunchFold
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from tests.k3fixtures import bot_config, runner_data, running_runner


async def _run(certs: DevCerts, tmp_path: Path, scenario: str) -> str:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario=scenario)) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        started = await Coordinator(config, store).start("cluster-a", "U1")
        await Coordinator(config, store).follow(started, _ignore)
        store.close()
    (tmp_path / "k3.toml").write_text(
        f'store = "{tmp_path / "k3.db"}"\n[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "i"\nlaunch = "vllm serve m"\n'
    )
    return started.run_id


async def test_a_ladder_run_is_drawn_one_bar_per_launch(
    certs: DevCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = await _run(certs, tmp_path, "prefix-cache-crash")
    picture = tmp_path / "timeline.png"
    assert main(["--config", str(tmp_path / "k3.toml"), "show", run_id, "--timeline", str(picture)]) == 0
    assert capsys.readouterr().err == f"timeline of 7 launch(es) written to {picture}\n"
    height, width, _ = imread(picture).shape
    assert width > 1000 and height > 400
    bars = LaunchFold.of(Store(tmp_path / "k3.db").events(run_id))
    assert [(bar.label, bar.proxy) for bar in bars] == [
        ("minimal_launch", False),
        ("ladder: prefix_caching", True),  # on dummy weights, then confirmed on the real configuration
        ("ladder: prefix_caching/confirm", False),
        ("ladder: long_input", True),
        ("ladder: max_model_len", True),  # concurrency reuses its server
        ("ladder: tools_structured_output", True),
        ("ladder: prefix_caching/repeat-2", True),
    ]
    request = ("request", "request_error")
    assert [bar.failure[1:] if bar.failure else None for bar in bars] == [
        None, request, request, None, None, None, request,
    ]  # fmt: skip
    assert [step for _, step, _ in bars[4].steps] == ["max_model_len", "concurrency"]
    for bar in bars:  # every launch went through the phases in order, on a time line that only goes forward
        assert [phase for phase, _ in bar.phases] == [
            "gpu_detect",
            "weight_load",
            "engine_init",
            "api_listen",
            "request",
        ]
        assert all(begin <= end for _, begin, end in bar.segments()) and bar.start <= bar.end
    assert all(a.end <= b.start for a, b in itertools.pairwise(bars))


async def test_a_repeated_start_up_failure_is_two_bars_each_marked(certs: DevCerts, tmp_path: Path) -> None:
    run_id = await _run(certs, tmp_path, "demo")
    bars = LaunchFold.of(Store(tmp_path / "k3.db").events(run_id))
    assert [(bar.label, bar.failure[1:] if bar.failure else None) for bar in bars] == [
        ("minimal_launch", ("gpu_detect", "nccl_comm")),
        ("minimal_launch/attempt-2", ("gpu_detect", "nccl_comm")),
    ]
    assert (
        main(["--config", str(tmp_path / "k3.toml"), "show", run_id, "--timeline", str(tmp_path / "no" / "x.png")]) == 2
    )


def _event(seconds: float, **payload: object) -> pb.RunEvent:
    event = pb.RunEvent(run_id="r", seq=1, **payload)
    event.at.FromNanoseconds(int(seconds * 1e9))
    return event


def test_each_launch_event_starts_a_bar_and_an_updated_first_error_is_not_a_second_one() -> None:
    gpu, load = pb.PHASE_GPU_DETECT, pb.PHASE_WEIGHT_LOAD
    oom = pb.FirstError(phase=load, category=pb.ERROR_CATEGORY_OOM, signature="oom")
    dummy = pb.ProxyUsed(id="dummy_weights", removes="reading the weights")
    events = [
        _event(0, stage_started=pb.StageStarted(stage=pb.STAGE_MINIMAL_LAUNCH)),
        _event(0.5, launch_started=pb.LaunchStarted(source="minimal_launch", number=1)),
        _event(1, phase_reached=pb.PhaseReached(phase=gpu)),
        _event(2, phase_reached=pb.PhaseReached(phase=load)),
        _event(3, first_error=oom),
        _event(
            4,
            first_error=pb.FirstError(phase=load, category=pb.ERROR_CATEGORY_OOM, signature="oom", secondary_oom=True),
        ),
        _event(5, launch_started=pb.LaunchStarted(source="minimal_launch/proxy", proxies=[dummy], number=2)),
        _event(6, phase_reached=pb.PhaseReached(phase=gpu)),
        _event(7, phase_reached=pb.PhaseReached(phase=load)),
        _event(8, first_error=oom),
        _event(8.5, launch_started=pb.LaunchStarted(source="minimal_launch/attempt-3", number=3)),
        _event(9, first_error=pb.FirstError(phase=gpu, category=pb.ERROR_CATEGORY_DRIVER_CUDA_INIT, signature="cuda")),
        _event(10, stage_finished=pb.StageFinished(stage=pb.STAGE_MINIMAL_LAUNCH)),  # not the engine: no later end
    ]
    bars = LaunchFold.of(events)
    assert [(bar.start, bar.end, bar.proxies) for bar in bars] == [
        (0.5, 4.0, ()),
        (5.0, 8.0, (("dummy_weights", "reading the weights"),)),
        (8.5, 9.0, ()),
    ]
    assert [bar.label for bar in bars] == ["minimal_launch", "minimal_launch", "minimal_launch/attempt-3"]
    assert [bar.failure for bar in bars] == [
        (3.0, "weight_load", "oom"),
        (8.0, "weight_load", "oom"),
        (9.0, "gpu_detect", "driver_cuda_init"),
    ]
    assert bars[2].phases == [("gpu_detect", 9.0)]  # no phase line: the failure's own phase


async def _ignore(event: pb.RunEvent) -> None:
    """The store keeps the events; these tests read them back from it."""
