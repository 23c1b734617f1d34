"""Fingerprints without Docker: the real NVML-missing path, the probe against a given Python, sha256, diff, CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from kernel.fingerprint import diff, load_fingerprint, to_text
from kernel.fingerprint.document import MAX_BYTES, seal
from runner.engines.process import ProcessBackend
from runner.fingerprint import Change, PythonTarget, collect
from runner.nvml import GpuInfo, NvmlView, PynvmlSource
from vllm_sim.backend import ScenarioNvml

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
CONTRACT = {
    "schema", "captured_at", "host", "nvml", "image", "runtime", "env", "launch", "request", "changes",
    "deployment_error", "caches", "sha256",
}  # fmt: skip


class FakeNvml:
    """NVML as a GPU host would answer: for tests that need a driver without a GPU."""

    def __init__(self, driver: str = "580.65.06", gpus: int = 8, used_mib: int = 0) -> None:
        self.view = NvmlView(
            available=True,
            driver_version=driver,
            cuda_driver_version="13.0",
            gpus=tuple(GpuInfo(i, "NVIDIA GB300", f"GPU-{i}", 294912, used_mib) for i in range(gpus)),
        )

    def read(self) -> NvmlView:
        return self.view


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bare-metal vLLM install: dist-info in a site-packages on PYTHONPATH, a CUDA toolkit in CUDA_HOME, and a
    torch package that leaves a mark if anything imports it."""
    site = tmp_path / "venv" / "site-packages"
    for name, version in (("vllm", "0.33.0"), ("torch", "2.14.0"), ("transformers", "4.60.0")):
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
        (site / f"{name}-{version}.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n")
    (site / "nvidia_nccl_cu13-2.28.3.dist-info").mkdir()
    (site / "nvidia_nccl_cu13-2.28.3.dist-info" / "METADATA").write_text("Name: nvidia-nccl-cu13\nVersion: 2.28.3\n")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.14.0'\ncuda: Optional[str] = '13.0'\n")
    (site / "torch" / "__init__.py").write_text(f"open({str(tmp_path / 'torch-imported')!r}, 'w').close()\n")
    cuda = tmp_path / "cuda-13.0"
    (cuda / "compat").mkdir(parents=True)
    (cuda / "compat" / "libcuda.so.580.65.06").write_text("")
    (cuda / "version.json").write_text('{"cuda": {"name": "CUDA SDK", "version": "13.0.1"}}')
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    return tmp_path


def test_nvml_missing_on_this_host_is_reported_not_raised() -> None:
    view = PynvmlSource().read()  # the real library: this machine has no NVIDIA driver
    assert view.available is False and view.error and "NVML" in view.error
    scene = collect(PynvmlSource(), None)
    assert scene["nvml"] == {
        "available": False,
        "error": view.error,
        "driver_version": None,
        "cuda_driver_version": None,
        "gpu_count": None,
        "gpus": [],
        "processes": [],
    }
    assert scene["runtime"]["error"] == "no image or Python given to probe" and scene["image"] is None


def test_probe_reads_what_a_python_would_load_without_importing_torch(install: Path) -> None:
    scene = collect(FakeNvml(), PythonTarget(sys.executable))
    runtime = scene["runtime"]
    assert set(scene) == CONTRACT
    assert {k: runtime[k] for k in ("source", "vllm", "torch", "torch_cuda", "cuda_runtime", "nccl")} == {
        "source": "python",
        "vllm": "0.33.0",
        "torch": "2.14.0",
        "torch_cuda": "13.0",
        "cuda_runtime": "13.0.1",
        "nccl": "2.28.3",
    }
    assert runtime["python"] == "{}.{}.{}".format(*sys.version_info[:3]) and runtime["transformers"] == "4.60.0"
    assert runtime["cuda_compat"] == {
        "dirs": [str((install / "cuda-13.0" / "compat").resolve())],
        "driver": "580.65.06",
        "loaded": False,
        "via": [],
    }
    assert runtime["container_nvidia_smi"]["error"] == "nvidia-smi not found"
    assert not (install / "torch-imported").exists()


def test_compat_libraries_on_the_loader_path_are_seen(install: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/usr/local/nvidia/lib64:{install / 'cuda-13.0' / 'compat'}")
    monkeypatch.setenv("VLLM_ENABLE_CUDA_COMPATIBILITY", "1")
    compat = collect(FakeNvml(), PythonTarget(sys.executable))["runtime"]["cuda_compat"]
    assert compat["loaded"] is True and compat["via"] == ["LD_LIBRARY_PATH", "VLLM_ENABLE_CUDA_COMPATIBILITY"]


def test_a_path_that_is_not_a_python_gives_a_reason(tmp_path: Path) -> None:
    runtime = collect(FakeNvml(), PythonTarget(str(tmp_path / "nope")))["runtime"]
    assert runtime["vllm"] is None and runtime["error"] == f"{tmp_path / 'nope'} is not a runnable Python"


def test_secrets_never_reach_the_fingerprint(install: Path) -> None:
    environ = {"HF_TOKEN": HF, "VLLM_API_KEY": "hunter2-prod", "NCCL_DEBUG": "INFO", "HOME": "/root", "PATH": "/bin"}
    scene = collect(
        FakeNvml(),
        PythonTarget(sys.executable),
        argv=["vllm", "serve", "m", "--api-key", "hunter2-prod", "--hf-token", HF],
        changes=[Change("2026-11-30T09:00:00+00:00", f"rotated token {HF}", "U1")],
        environ=environ,
    )
    text = to_text(scene)
    assert HF not in text and "hunter2-prod" not in text
    assert set(scene["env"]) == {"HF_TOKEN", "VLLM_API_KEY", "NCCL_DEBUG"}  # HOME, PATH: not part of the scene
    # one secret, one placeholder: in env, argv and the change log alike
    assert (
        scene["env"]["HF_TOKEN"] == scene["launch"]["argv"][-1]
        and scene["env"]["HF_TOKEN"] in text.split("rotated token ")[1]
    )


def _scene(**kwargs: Any) -> dict[str, Any]:
    return collect(FakeNvml(**kwargs), None, environ={"NCCL_DEBUG": "INFO"})


def test_sha256_ignores_volatile_fields_and_follows_what_matters() -> None:
    a = _scene()
    busy = _scene(used_mib=4096)  # memory in use and capture time differ
    assert busy["captured_at"] and a["sha256"] == busy["sha256"]
    assert _scene(driver="570.86.15")["sha256"] != a["sha256"]
    assert a["sha256"] == seal(a)["sha256"]


def test_diff_puts_what_matters_apart_from_noise() -> None:
    a = _scene()
    b = collect(FakeNvml(driver="570.86.15", gpus=4, used_mib=9000), None, environ={"NCCL_DEBUG": "TRACE"})
    result = diff(a, b)
    kinds = {d["path"]: d["kind"] for d in result["differences"]}
    assert not result["same_scene"]
    assert kinds["nvml.driver_version"] == kinds["nvml.gpu_count"] == kinds["env.NCCL_DEBUG"] == "matters"
    assert kinds["nvml.gpus.0.memory_used_mib"] == "noise" and kinds["nvml.gpus.7.name"] == "matters"
    assert [d["kind"] for d in result["differences"]] == sorted(
        (d["kind"] for d in result["differences"]), key=("matters", "other", "noise").index
    )
    same = diff(a, _scene(used_mib=100))
    assert same["same_scene"] and {d["kind"] for d in same["differences"]} <= {"noise"}


def test_the_sim_host_answers_nvml_from_its_scenario(tmp_path: Path) -> None:
    scenario = tmp_path / "leftover.toml"
    scenario.write_text(
        '[deployment]\ncommand = "vllm serve m"\n'
        '[host]\ngpu_count = 4\ngpu_name = "NVIDIA H200"\ngpu_memory_mib = 144384\nforeign_memory_mib = 20480\n'
    )
    view = ScenarioNvml(str(scenario)).read()
    assert view.available and view.driver_version == "580.65.06" and view.cuda_driver_version == "13.0"
    assert [g.name for g in view.gpus] == ["NVIDIA H200"] * 4 and view.gpus[0].memory_total_mib == 141 * 1024
    assert [(p.gpu_index, p.used_memory_mib) for p in view.processes] == [(i, 20 * 1024) for i in range(4)]
    scenario.write_text("[host]\ngpu_count = 0\n")
    broken = ScenarioNvml(str(scenario)).read()
    assert not broken.available and broken.error and "gpu_count" in broken.error


def test_the_process_backend_probes_the_python_behind_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport vllm\n")
    script.chmod(0o755)
    (tmp_path / "vllm-shell").write_text("#!/bin/sh\n")
    (tmp_path / "vllm-shell").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    backend = ProcessBackend(FakeNvml())
    assert backend.probe_target(["vllm", "serve", "m"], "") == PythonTarget(sys.executable)
    assert backend.probe_target(["vllm-shell"], "") is None
    assert backend.probe_target(["no-such-program"], "") is None


# ---- the CLI ----


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_fingerprint_check_and_diff(install: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "fingerprint", "--python", sys.executable, "--json")
    scene = json.loads(out)
    assert code == 0 and set(scene) == CONTRACT and scene["runtime"]["vllm"] == "0.33.0"
    code, out, _ = cli(capsys, "fingerprint", "--python", sys.executable)
    assert code == 0 and "vllm 0.33.0" in out and f"sha256   {scene['sha256']}" in out
    a = tmp_path / "a.json"
    a.write_text(to_text(scene))
    code, out, _ = cli(capsys, "check", "--baseline", "kimi-k3", "--fingerprint", str(a), "--json")
    report = json.loads(out)
    assert code == 0 and report["verdict"] == "warn"  # no NVML, no nvidia-smi, no image: unknowns
    assert {r["id"]: r["status"] for r in report["rules"]}["image_cuda13_build"] == "pass"
    old = tmp_path / "old.json"
    changed = {**scene, "runtime": {**scene["runtime"], "cuda_runtime": "12.8.1", "torch_cuda": "12.8"}}
    old.write_text(to_text(seal(changed)))
    code, out, _ = cli(capsys, "check", "--baseline", "kimi-k3", "--fingerprint", str(old))
    assert code == 1 and "baseline kimi-k3: FAIL" in out and "✗ image_cuda13_build [fail]" in out
    code, out, _ = cli(capsys, "diff", str(a), str(a))
    assert code == 0 and "same scene" in out
    code, out, _ = cli(capsys, "diff", str(a), str(old), "--json")
    paths = {d["path"]: d for d in json.loads(out)["differences"]}
    assert code == 1 and paths["runtime.cuda_runtime"] == {
        "path": "runtime.cuda_runtime",
        "kind": "matters",
        "a": "13.0.1",
        "b": "12.8.1",
    }


@pytest.mark.parametrize(
    "problem", ["missing", "invalid", "tampered", "oversized", "not-a-fingerprint", "profile", "python"]
)
def test_cli_bad_input_is_one_line_and_exit_2(problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.json"
    good.write_text(to_text(_scene()))
    path = tmp_path / "x.json"
    args = ["check", "--baseline", "kimi-k3", "--fingerprint", str(path)]
    expected = {
        "missing": "No such file or directory",
        "invalid": "not JSON",
        "tampered": "sha256 does not match the content",
        "oversized": "larger than 8 MiB",
        "not-a-fingerprint": "not a k3repro fingerprint",
        "profile": "unknown baseline profile 'nope'",
        "python": "not an executable file",
    }[problem]
    if problem == "invalid":
        path.write_text('{"schema": 1,')
    elif problem == "tampered":
        path.write_text(good.read_text().replace('"580.65.06"', '"590.10.01"'))
    elif problem == "oversized":
        path.write_bytes(b" " * (MAX_BYTES + 1))
    elif problem == "not-a-fingerprint":
        path.write_text('{"schema": 2}')
    elif problem == "profile":
        args = ["check", "--baseline", "nope", "--fingerprint", str(good)]
    elif problem == "python":
        args = ["fingerprint", "--python", str(tmp_path / "no-python")]
    code, out, err = cli(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and expected in err and err.startswith("k3repro: ")
    if problem not in ("profile", "python"):
        code, _, err = cli(capsys, "diff", str(good), str(path))
        assert code == 2 and expected in err
    assert load_fingerprint(str(good))["schema"] == 1
