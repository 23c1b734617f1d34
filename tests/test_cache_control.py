"""The fresh-cache control on the real runner and vllm-sim: a stale JIT cache is named, a software failure is not.

The simulator keeps its JIT kernels where FlashInfer keeps its cache (FLASHINFER_WORKSPACE_BASE), read as the real
server reads it; the runner's control launch moves every cache to a new, empty folder under the run's work dir.
"""

from __future__ import annotations

import gzip
import json
import secrets
from pathlib import Path

import pytest

from bot import blocks
from bot.bundle import export_bundle
from bot.handoff import run_handoff
from bot.record import RunRecord
from bot.report import run_report
from bot.store import Store
from kernel.fingerprint.caches import cache_specs
from kernel.tls import DevCerts
from kernel.vllm_cli import parse_launch_command
from protos import runner_pb2 as pb
from protos.vocab import to_id
from runner.config import KubernetesSettings
from runner.engines.fresh_caches import CONTAINER_ROOT, redirect
from runner.engines.kubernetes import pod_manifest
from runner.stages.cache_control import SOURCE, why
from runner.stages.context import Attempt
from tests.k3fixtures import bot_core, finished_run, run_to_end, runner_data
from vllm_sim import jit_cache


@pytest.fixture
def host_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's caches, each where its variable says (none of this machine's own): all absent to start with."""
    root = tmp_path / "host-caches"
    for spec in cache_specs():
        monkeypatch.setenv(spec.env, str(root / spec.name))
    return root


def _checklist(events: list[pb.RunEvent]) -> dict[str, tuple[int, str]]:
    return {
        to_id(pb.ChecklistId, e.checklist_item.item): (e.checklist_item.state, e.checklist_item.evidence)
        for e in events
        if e.HasField("checklist_item")
    }


def _controls(events: list[pb.RunEvent]) -> list[pb.LaunchStarted]:
    return [e.launch_started for e in events if e.HasField("launch_started") and SOURCE in e.launch_started.source]


async def test_a_stale_jit_cache_fails_differently_each_start_and_the_fresh_cache_control_names_it(
    certs: DevCerts, tmp_path: Path, host_caches: Path
) -> None:
    jit_cache.write("flashinfer", "vllm-0.31.1+cu129")  # an older image's kernels, left in the host's cache
    stale = sorted((host_caches / "flashinfer").rglob("*.so"))
    events = await run_to_end(certs, tmp_path, runner_data(certs, tmp_path / "runner", scenario="stale-jit-cache"))
    errors = [e.first_error for e in events if e.HasField("first_error")]
    assert {to_id(pb.Phase, e.phase) for e in errors} == {"engine_init"} and len({e.signature for e in errors}) == 2
    state, evidence = _checklist(events)["caches_not_stale"]
    where = str(host_caches / "flashinfer" / ".cache" / "flashinfer")  # under FLASHINFER_WORKSPACE_BASE
    assert state == pb.CHECKLIST_STATE_FAILS and f"the host's cache is stale: clear {where}" in evidence
    assert evidence.startswith("a fresh flashinfer cache starts")
    assert _controls(events)  # the control ran: a proxy first, then the real configuration confirmed it
    finished = events[-1].run_finished
    assert finished.headline.startswith("a fresh flashinfer cache starts") and f"clear {where}" in finished.headline
    assert sorted((host_caches / "flashinfer").rglob("*.so")) == stale  # the host's cache: read, never touched
    fresh = tmp_path / "runner" / "runs"
    built = sorted(p.read_text() for p in fresh.rglob("*.so"))
    assert built and set(built) == {"vllm-0.32.0+cu130"}  # each control compiled into its own empty cache
    report = run_report("run", events)
    assert report["checklist"]["caches_not_stale"]["state"] == "fails"
    artifact = json.loads(next(e.artifact.content for e in events if e.artifact.name == "fresh_caches_control"))
    assert artifact["outcome"] == "answered" and artifact["suspects"] == [{"cache": "flashinfer", "path": where}]
    checklist = blocks.checklist(RunRecord.replay("run", events))
    thread = checklist.text + json.dumps(checklist.blocks)
    assert "caches_not_stale" in thread and f"clear {where}" in thread  # the thread's checklist shows the finding


async def test_an_engine_init_failure_that_fails_the_same_with_fresh_caches_is_not_the_caches(
    certs: DevCerts, tmp_path: Path, host_caches: Path
) -> None:
    events = await run_to_end(certs, tmp_path, runner_data(certs, tmp_path / "runner", scenario="cudagraph-capture"))
    state, evidence = _checklist(events)["caches_not_stale"]
    assert state == pb.CHECKLIST_STATE_HOLDS and "fails the same with fresh caches" in evidence
    assert "not the caches" in events[-1].run_finished.headline
    assert len(_controls(events)) >= 1


async def test_a_failure_that_moves_between_phases_and_moves_the_same_with_fresh_caches_is_not_the_caches(
    certs: DevCerts, tmp_path: Path, host_caches: Path
) -> None:
    events = await run_to_end(certs, tmp_path, runner_data(certs, tmp_path / "runner", scenario="flaky-phases"))
    phases = [to_id(pb.Phase, e.first_error.phase) for e in events if e.HasField("first_error")]
    assert phases == ["weight_load", "engine_init", "engine_init"]  # two attempts, then the control
    state, evidence = _checklist(events)["caches_not_stale"]
    assert state == pb.CHECKLIST_STATE_HOLDS and "fails the same with fresh caches (engine_init" in evidence
    finished = events[-1].run_finished
    assert finished.decision == pb.DECISION_ISOLATE and "clear" not in finished.headline  # the node, not a cache


async def test_a_failure_outside_the_cache_phases_gets_no_control_launch(
    certs: DevCerts, tmp_path: Path, host_caches: Path
) -> None:
    events = await run_to_end(certs, tmp_path, runner_data(certs, tmp_path / "runner", scenario="demo"))
    state, evidence = _checklist(events)["caches_not_stale"]
    assert state == pb.CHECKLIST_STATE_NOT_APPLICABLE and "no fresh-cache control" in evidence
    assert not _controls(events)


def test_the_condition_is_engine_init_a_moving_phase_or_a_cache_read() -> None:
    plain = parse_launch_command(["vllm", "serve", "org/model"])
    remote = parse_launch_command(["vllm", "serve", "org/model", "--trust-remote-code"])
    assert why([Attempt("engine_init", "oom", "s1")], plain) == "the failure is in engine_init"
    assert "moves between phases (weight_load, engine_init)" in why(
        [Attempt("weight_load", "other", "s1"), Attempt("engine_init", "other", "s2")], plain
    )
    assert why([Attempt("gpu_detect", "other", "s1", during="remote_code_load")], plain).endswith("remote_code_load")
    config = [Attempt("gpu_detect", "model_config", "s1", during="model_config_creation")]
    assert why(config, plain) == ""  # without remote code, vLLM's config creation reads no cache
    assert why(config, remote) == "the failure was met during model_config_creation"
    assert why([Attempt("gpu_detect", "nccl_comm", "s1")], remote) == ""
    unknown = [Attempt("unknown", "nccl_comm", "s1"), Attempt("gpu_detect", "nccl_comm", "s2")]
    assert why(unknown, plain) == ""  # an unknown phase is no phase a failure moved to
    assert why([Attempt("engine_init", "oom", "s1", foreign=True)], plain) == ""  # memory held by others


def test_every_cache_is_redirected_by_its_own_variable() -> None:
    env = redirect("/work/run-1/fresh-caches/launch-1")
    assert env == {s.env: f"/work/run-1/fresh-caches/launch-1/{s.name}" for s in cache_specs()}
    assert {"TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "HF_MODULES_CACHE", "FLASHINFER_WORKSPACE_BASE"} <= set(env)


async def test_a_planted_secret_in_a_cache_path_never_leaves_the_control_in_clear(
    certs: DevCerts, tmp_path: Path, host_caches: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = "hf_Q7" + secrets.token_hex(16)  # a hub token's shape, planted in the host cache's path
    folder = host_caches / planted / "flashinfer"
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(folder))
    jit_cache.write("flashinfer", "vllm-0.31.1+cu129")
    runner = runner_data(certs, tmp_path / "runner", scenario="stale-jit-cache")
    async with bot_core(certs, tmp_path, runner) as core:
        run = await finished_run(core)
    store = Store(tmp_path / "k3.db")
    events = b"".join(e.SerializeToString() for e in store.events(run.run_id))
    bundle = gzip.decompress(export_bundle(store, run.run_id).to_bytes())
    handoff = run_handoff(store, run.run_id)
    places = {
        "the events": events,
        "the bundle": bundle,
        "the hand-off report": handoff.encode(),
        **{str(p): p.read_bytes() for p in (tmp_path / "runner").rglob("*") if p.is_file()},
        **{str(p): p.read_bytes() for p in tmp_path.glob("k3.db*")},
    }
    assert b"a fresh flashinfer cache starts" in events and "Fresh-cache control: a fresh flashinfer" in handoff
    assert b"[REDACTED:" in events and "[REDACTED:" in handoff
    assert [name for name, data in places.items() if planted.encode() in data] == []


def test_a_pod_gets_fresh_caches_inside_its_own_filesystem_only_when_asked() -> None:
    settings = KubernetesSettings(env=(("HF_MODULES_CACHE", "/cache/modules"), ("HF_HOME", "/cache")))
    argv = ["vllm", "serve", "org/model", "--port", "8000"]

    def env(fresh: bool) -> dict[str, str]:
        body = pod_manifest(settings, "node-1", argv, run_id="r1", image="i", launch=1, fresh_caches=fresh)
        return {e["name"]: e["value"] for e in body["spec"]["containers"][0]["env"]}

    assert env(False) == {"HF_MODULES_CACHE": "/cache/modules", "HF_HOME": "/cache"}
    assert env(True) == {"HF_HOME": "/cache", **redirect(CONTAINER_ROOT)}  # the runner's values win, one of each
