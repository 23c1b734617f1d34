"""Baselines: every kimi-k3 rule through pass / warn / fail / unknown, the loader, and the baseline stage."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.coordinator import Coordinator
from bot.record import image_digest
from bot.store import AsyncStore
from kernel.baseline import BaselineError, load_baseline
from kernel.fingerprint.document import seal, to_text
from kernel.tls import DevCerts
from kernel.vllm_cli import parse_launch_command
from protos import runner_pb2 as pb
from runner.config import parse_runner_config
from runner.stages import baseline as baseline_stage
from runner.stages import freeze
from runner.stages.context import RunContext
from tests.k3fixtures import bot_config, runner_data, running_runner
from vllm_sim.backend import SimBackend

GOOD: dict[str, Any] = {
    "schema": 1,
    "captured_at": "2026-11-30T10:00:00+00:00",
    "host": {"hostname": "gpu-a1", "os": "Ubuntu 24.04", "kernel": "6.8.0"},
    "nvml": {
        "available": True,
        "error": None,
        "driver_version": "580.65.06",
        "cuda_driver_version": "13.0",
        "gpu_count": 8,
        "gpus": [
            {"index": i, "name": "NVIDIA GB300", "uuid": f"GPU-{i}", "memory_total_mib": 294912, "memory_used_mib": 0}
            for i in range(8)
        ],
        "processes": [],
    },
    "image": {
        "ref": "vllm/vllm-openai@sha256:" + "a" * 64,
        "id": "sha256:" + "b" * 64,
        "repo_digests": ["vllm/vllm-openai@sha256:" + "a" * 64],
        "pinned": True,
        "env": {"CUDA_VERSION": "13.0.1"},
        "labels": {},
    },
    "runtime": {
        "source": "image",
        "python": "3.12.3",
        "vllm": "0.33.0",
        "torch": "2.14.0",
        "torch_cuda": "13.0",
        "cuda_runtime": "13.0.1",
        "cuda_runtime_source": "/usr/local/cuda/version.json",
        "nccl": "2.28.3",
        "cuda_compat": {"dirs": ["/usr/local/cuda-13.0/compat"], "driver": "580.65.06", "loaded": False, "via": []},
        "container_nvidia_smi": {"available": True, "driver_version": "580.65.06", "cuda_version": "13.0"},
    },
    "env": {},
    "launch": {"argv": []},
    "changes": [],
}


def scene(**changes: Any) -> dict[str, Any]:
    """GOOD with dotted-path changes, e.g. scene(**{"nvml.driver_version": "570.1"})."""
    document = copy.deepcopy(GOOD)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = document
        for key in parents:
            node = node[key]
        node[last] = value
    return seal(document)


def statuses(document: dict[str, Any]) -> dict[str, str]:
    return {rule["id"]: rule["status"] for rule in load_baseline("kimi-k3").evaluate(document)["rules"]}


def rule(document: dict[str, Any], rule_id: str) -> dict[str, Any]:
    report = load_baseline("kimi-k3").evaluate(document)
    return next(r for r in report["rules"] if r["id"] == rule_id)


def test_the_recipe_scene_passes_every_rule() -> None:
    report = load_baseline("kimi-k3").evaluate(scene())
    assert report["verdict"] == "pass"
    assert set(statuses(scene()).values()) == {"pass"}
    assert report["baseline"] == "kimi-k3" and report["fingerprint_sha256"] == scene()["sha256"]
    assert all(set(r) >= {"id", "status", "expected", "actual", "message"} for r in report["rules"])


@pytest.mark.parametrize(
    ("changes", "status", "words"),
    [
        ({"runtime.cuda_runtime": "12.9.1", "runtime.torch_cuda": "12.9"}, "fail", "needs a CUDA 13 build"),
        ({"image.ref": "vllm/vllm-openai:v0.19.0-cu129", "image.pinned": False}, "fail", "not a CUDA 13 build"),
        # the probe saw nothing: the image's declared CUDA_VERSION is the fallback
        ({"runtime.cuda_runtime": None, "runtime.torch_cuda": None}, "pass", "CUDA 13.0.1"),
        ({"runtime.cuda_runtime": None, "runtime.torch_cuda": None, "image.env": {}}, "unknown", "no CUDA version"),
    ],
)
def test_image_must_be_a_cuda13_build(changes: dict[str, Any], status: str, words: str) -> None:
    result = rule(scene(**changes), "image_cuda13_build")
    assert result["status"] == status and words in result["message"]


def test_driver_must_be_r580_or_newer() -> None:
    assert rule(scene(**{"nvml.driver_version": "580.65.06"}), "host_driver_r580")["status"] == "pass"
    old = rule(scene(**{"nvml.driver_version": "570.86.15"}), "host_driver_r580")
    assert old["status"] == "fail" and "r570" in old["message"] and old["actual"] == "570.86.15 (host NVML)"
    # NVML missing on the host: the container's nvidia-smi still tells the driver
    no_nvml = scene(**{"nvml.available": False, "nvml.driver_version": None})
    assert rule(no_nvml, "host_driver_r580")["actual"] == "580.65.06 (nvidia-smi in the container)"
    blind = scene(**{"nvml.available": False, "runtime.container_nvidia_smi": None})
    assert rule(blind, "host_driver_r580")["status"] == "unknown"


def test_runtime_newer_than_the_driver_ceiling_fails_even_when_nvidia_smi_works() -> None:
    newer = rule(scene(**{"runtime.cuda_runtime": "13.2.0"}), "cuda_runtime_within_driver")
    assert newer["status"] == "fail"
    assert "even though nvidia-smi works in the container" in newer["message"]
    # torch's build counts too: the newer of the two is what must be supported
    torch_newer = scene(**{"runtime.torch_cuda": "13.1"})
    assert rule(torch_newer, "cuda_runtime_within_driver")["status"] == "fail"
    assert rule(scene(**{"nvml.cuda_driver_version": "13.2"}), "cuda_runtime_within_driver")["status"] == "pass"
    unknown = scene(**{"nvml.available": False, "runtime.container_nvidia_smi": None})
    assert rule(unknown, "cuda_runtime_within_driver")["status"] == "unknown"


def test_hardware_boundary_is_a_warning_not_a_failure() -> None:
    gpus = GOOD["nvml"]["gpus"]
    fewer = scene(**{"nvml.gpus": gpus[:4]})
    other = scene(**{"nvml.gpus": [{**g, "name": "NVIDIA H200"} for g in gpus]})
    assert rule(fewer, "hardware_boundary")["status"] == "warn"
    assert "outside the recipe's hardware boundary" in rule(other, "hardware_boundary")["message"]
    assert load_baseline("kimi-k3").evaluate(other)["verdict"] == "warn"
    blind = scene(**{"nvml.available": False, "runtime.container_nvidia_smi": None})
    assert rule(blind, "hardware_boundary")["status"] == "unknown"


def test_a_tag_not_pinned_to_a_digest_warns() -> None:
    tag = scene(**{"image.ref": "vllm/vllm-openai:kimi-k3", "image.pinned": False})
    result = rule(tag, "image_pinned")
    assert result["status"] == "warn" and "vllm/vllm-openai@sha256:" in result["message"]
    local = scene(**{"image.ref": "vllm/vllm-openai:kimi-k3", "image.pinned": False, "image.repo_digests": []})
    assert "cannot be rolled back" in rule(local, "image_pinned")["message"]
    assert rule(scene(image=None), "image_pinned")["status"] == "unknown"


def test_compat_libraries_on_a_driver_that_does_not_need_them_warn() -> None:
    compat = {"dirs": ["/usr/local/cuda-13.0/compat"], "driver": "580.65.06", "loaded": True, "via": ["ld.so.conf"]}
    unneeded = rule(scene(**{"runtime.cuda_compat": compat}), "compat_libs_needed")
    assert unneeded["status"] == "warn" and "old environment" in unneeded["message"]
    needed = scene(**{"runtime.cuda_compat": compat, "nvml.cuda_driver_version": "12.8"})
    assert rule(needed, "compat_libs_needed")["status"] == "pass"
    assert rule(scene(**{"runtime.cuda_compat": None}), "compat_libs_needed")["status"] == "unknown"


def test_missing_input_is_unknown_and_never_a_pass() -> None:
    empty = seal({**GOOD, "nvml": {"available": False}, "image": None, "runtime": {}})
    report = load_baseline("kimi-k3").evaluate(empty)
    assert {r["status"] for r in report["rules"]} == {"unknown"}
    assert report["verdict"] == "warn"


def test_profiles_are_data_and_a_site_directory_wins(tmp_path: Path) -> None:
    baseline = load_baseline("kimi-k3")
    assert baseline.name == "kimi-k3" and all(r.id and r.description for r in baseline.rules)
    (tmp_path / "kimi-k3.toml").write_text(
        'name = "kimi-k3"\n[[rule]]\nid = "driver"\ncheck = "min_driver"\nmin_branch = 590\ndescription = "r590"\n'
    )
    site = load_baseline("kimi-k3", (tmp_path,))
    assert [r.id for r in site.rules] == ["driver"]
    assert site.evaluate(scene())["verdict"] == "fail"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name = "x"\n[[rule]]\nid = "a"\ncheck = "nope"\n', "unknown check 'nope'"),
        ('name = "x"\n[[rule]]\nid = "a"\ncheck = "min_driver"\n', "needs 'min_branch'"),
        ('name = "x"\n[[rule]]\nid = "a"\ncheck = "min_driver"\nmin_branch = "580"\n', "must be int"),
        ('name = "x"\n[[rule]]\nid = "a"\ncheck = "image_digest"\nseverity = "info"\n', "severity must be"),
        ('name = "x"\n', "at least one [[rule]]"),
        (
            'name = "x"\n[[rule]]\nid = "a"\ncheck = "image_digest"\n[[rule]]\nid = "a"\ncheck = "compat_libs"\n',
            "twice",
        ),
    ],
)
def test_malformed_profiles_are_refused_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "x.toml").write_text(text)
    with pytest.raises(BaselineError, match=message.replace("[", r"\[")):
        load_baseline("x", (tmp_path,))


def test_unknown_or_unsafe_profile_names_are_refused() -> None:
    with pytest.raises(BaselineError, match=r"unknown baseline profile 'kimi-k9' \(known: kimi-k3\)"):
        load_baseline("kimi-k9")
    with pytest.raises(BaselineError, match="not valid"):
        load_baseline("../../etc/passwd")


async def _run(certs: DevCerts, tmp_path: Path, scenario: str) -> tuple[pb.RunFinished, list[pb.RunEvent]]:
    events: list[pb.RunEvent] = []

    async def record(event: pb.RunEvent) -> None:
        events.append(event)

    async with running_runner(runner_data(certs, tmp_path / "runner", scenario=scenario)) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        finished = await core.follow(await core.start("cluster-a", "U1"), record)
        store.close()
    return finished, events


async def test_an_incompatible_host_stops_the_run_at_baseline(certs: DevCerts, tmp_path: Path) -> None:
    scenario = tmp_path / "old-driver.toml"
    scenario.write_text(
        '[deployment]\ncommand = "vllm serve m"\n[host]\ndriver_version = "570.86.15"\ncuda_driver_version = "12.8"\n'
    )
    finished, events = await _run(certs, tmp_path, str(scenario))
    stages = {e.stage_finished.stage: e.stage_finished for e in events if e.HasField("stage_finished")}
    assert stages[pb.STAGE_FREEZE].status == pb.STAGE_STATUS_OK
    assert stages[pb.STAGE_BASELINE].status == pb.STAGE_STATUS_FAILED
    assert "host_driver_r580: driver r570 is older than r580" in stages[pb.STAGE_BASELINE].summary
    assert stages[pb.STAGE_MINIMAL_LAUNCH].status == pb.STAGE_STATUS_SKIPPED
    assert not any(e.HasField("phase_reached") for e in events)  # nothing was launched
    assert finished.summary.startswith("baseline: kimi-k3: incompatible scene")
    report = next(e.artifact.content for e in events if e.artifact.name == "baseline")
    assert '"verdict": "fail"' in report


async def test_warnings_let_the_run_go_on(certs: DevCerts, tmp_path: Path) -> None:
    finished, events = await _run(certs, tmp_path, "healthy")
    baseline = next(e.stage_finished for e in events if e.stage_finished.stage == pb.STAGE_BASELINE)
    assert baseline.status == pb.STAGE_STATUS_OK and baseline.summary.startswith("kimi-k3: warn")
    assert "unknown: " in baseline.summary  # the sim host has no vLLM install to probe: said, not passed
    assert any(e.HasField("request_result") for e in events)
    assert finished.status == pb.RUN_STATUS_COMPLETED


async def test_the_stage_refuses_an_unknown_profile(tmp_path: Path) -> None:
    runner = parse_runner_config(runner_data(None, tmp_path), base=tmp_path, origin="test")

    async def emit(**_: object) -> pb.RunEvent:
        return pb.RunEvent()

    request = pb.StartRunRequest(run_id="r1", profile="kimi-k9")
    ctx = RunContext("r1", request, parse_launch_command(["vllm", "serve", "m"]), runner, SimBackend("", 1), emit)
    ctx.evidence.fingerprint = scene()
    result = await baseline_stage.run(ctx)
    assert result.status == pb.STAGE_STATUS_FAILED and "unknown baseline profile 'kimi-k9'" in result.summary


def _nodes(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every path of a JSON value, containers included."""
    children: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = [(str(i), v) for i, v in enumerate(value)]
    found = [path] if path else []
    for key, child in children:
        found += _nodes(child, (*path, key))
    return found


def _replaced(document: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    copied = copy.deepcopy(document)
    node: Any = copied
    for key in path[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(path[-1]) if isinstance(node, list) else path[-1]] = value
    return copied


def test_check_on_fields_of_other_types_is_one_line_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every field of a full scene, replaced by every JSON type (sealed, so only the types are wrong): `check`
    decides (exit 0/1) or refuses in one line (exit 2); it never raises."""
    path = tmp_path / "scene.json"
    refused = 0
    for where in _nodes(GOOD):
        for value in (True, 7, "x", [], {}, None, [True], {"k": True}):
            path.write_text(to_text(seal(_replaced(GOOD, where, value))))
            code = main(["check", "--baseline", "kimi-k3", "--fingerprint", str(path)])
            out, err = capsys.readouterr()
            assert code in (0, 1, 2), (where, value)
            if code == 2:
                refused += 1
                assert out == "" and err.count("\n") == 1 and err.startswith("k3repro: "), (where, value, err)
    assert refused > 100  # the types the checks read are enforced, not merely survived
    path.write_text(to_text(seal(_replaced(GOOD, ("runtime", "cuda_compat"), True))))
    assert main(["check", "--baseline", "kimi-k3", "--fingerprint", str(path)]) == 2
    assert "'runtime.cuda_compat' must be an object or null, got true" in capsys.readouterr().err


def test_an_unsealed_fingerprint_is_checked_and_said_to_be_unsealed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One written by hand or another tool has no sha256: checked as given; a sealed one edited is still refused."""
    unsealed = tmp_path / "by-hand.json"
    unsealed.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "sha256"}))
    assert main(["check", "--baseline", "kimi-k3", "--fingerprint", str(unsealed)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("baseline kimi-k3: PASS\n  fingerprint unsealed (no sha256")
    assert main(["check", "--baseline", "kimi-k3", "--fingerprint", str(unsealed), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sealed"] is False and report["fingerprint_sha256"] is None and report["verdict"] == "pass"
    old_driver = tmp_path / "old-driver.json"
    old_driver.write_text(json.dumps({**GOOD, "nvml": {**GOOD["nvml"], "driver_version": "570.86.15"}}))
    assert main(["check", "--baseline", "kimi-k3", "--fingerprint", str(old_driver)]) == 1
    assert "✗ host_driver_r580 [fail]" in capsys.readouterr().out
    sealed = tmp_path / "sealed.json"
    sealed.write_text(to_text(scene()))
    assert main(["check", "--baseline", "kimi-k3", "--fingerprint", str(sealed), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sealed"] is True
    sealed.write_text(sealed.read_text().replace('"580.65.06"', '"590.10.01"'))
    assert main(["check", "--baseline", "kimi-k3", "--fingerprint", str(sealed)]) == 2
    assert "sha256 does not match the content" in capsys.readouterr().err
    # diff compares content addresses: an unsealed file is refused there, in one line
    assert main(["diff", str(unsealed), str(unsealed)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unsealed (no sha256" in err


def test_a_tag_freeze_found_a_registry_digest_for_is_pinned_by_it() -> None:
    """The run launches the tag by the digest freeze recorded, so `image_pinned` passes and names it; the
    bundle's digest (what a rerun launches) is that one, of the tag's own repository."""
    own, mirror = "sha256:" + "c" * 64, "sha256:" + "d" * 64
    tag = scene(
        **{
            "image.ref": "vllm/vllm-openai:kimi-k3",
            "image.pinned": False,
            "image.repo_digests": [f"mirror.local/vllm-openai@{mirror}", f"vllm/vllm-openai@{own}"],
        }
    )
    assert rule(tag, "image_pinned")["status"] == "warn"  # as taken: a tag is not pinned by itself
    pinned = freeze.pin(tag)
    assert pinned["image"]["pinned_ref"] == f"vllm/vllm-openai@{own}"
    assert pinned["sha256"] == seal(pinned)["sha256"] != tag["sha256"]  # sealed again, pin included
    result = rule(pinned, "image_pinned")
    assert result["status"] == "pass" and result["message"] == f"tag pinned by freeze to {own}"
    assert result["actual"] == f"vllm/vllm-openai:kimi-k3 → vllm/vllm-openai@{own}"
    assert load_baseline("kimi-k3").evaluate(pinned)["verdict"] == "pass"
    assert image_digest(pinned) == own
    by_digest = freeze.pin(scene())
    assert by_digest["image"]["pinned_ref"] == GOOD["image"]["ref"]
    assert rule(by_digest, "image_pinned")["message"] == "pinned to sha256:" + "a" * 64
    # built or imported locally: no registry digest, nothing to launch by; the rule still warns
    local = scene(**{"image.ref": "vllm/vllm-openai:kimi-k3", "image.pinned": False, "image.repo_digests": []})
    assert freeze.pin(local) == local and rule(freeze.pin(local), "image_pinned")["status"] == "warn"
