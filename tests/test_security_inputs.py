"""Bad input, as the console scripts get it: one line on stderr, exit 2, no traceback, nothing changed."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernel.tls import DevCerts

BIN = Path(sys.executable).parent
RUNNER_HEAD = 'name = "r"\ncluster = "cluster-a"\nallowed_images = ["vllm/vllm-openai:*"]\n'
SIM = '[engine]\nbackend = "sim"\n'


def _run_all(commands: Sequence[Sequence[str | Path]]) -> list[subprocess.CompletedProcess[str]]:
    """The commands, each its own process as a user would type it, a few at a time (each waits on its own)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = [
            pool.submit(subprocess.run, command, capture_output=True, text=True, timeout=60) for command in commands
        ]
        return [run.result() for run in runs]


def _one_line(result: subprocess.CompletedProcess[str], prog: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"{prog}: "), result.stderr
    return result.stderr


def _tls(certs: DevCerts, cert: Path | None = None) -> str:
    return f'[tls]\ncert = "{cert or certs.runner_cert}"\nkey = "{certs.runner_key}"\nclient_ca = "{certs.ca}"\n'


@pytest.fixture
def taken_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_runner_refuses_bad_configs_and_start_ups_in_one_line(certs: DevCerts, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "not.pem").write_text("hello")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "runner.lock").symlink_to("/dev/full")  # every write there: no space left on device
    cases = {
        "heartbeat_s = -1": RUNNER_HEAD + "heartbeat_s = -1\n" + SIM,
        "max_concurrent_runs = 0": RUNNER_HEAD + "max_concurrent_runs = 0\n" + SIM,
        "garbage listen": RUNNER_HEAD + 'listen = "nowhere"\n' + SIM,
        "state_dir a file": RUNNER_HEAD + 'state_dir = "a-file"\n' + SIM,
        "state_dir on a full disk": RUNNER_HEAD + 'state_dir = "full"\n' + SIM,
        "speed -5": RUNNER_HEAD + SIM + "[engine.sim]\nspeed = -5\n",
        "missing TLS file": RUNNER_HEAD + _tls(certs, tmp_path / "absent.pem") + SIM,
        "cert not PEM": RUNNER_HEAD + _tls(certs, tmp_path / "not.pem") + SIM,
        "unknown address": RUNNER_HEAD + 'listen = "203.0.113.9:0"\n' + SIM,
    }
    paths = []
    for name, text in cases.items():
        paths.append(path := tmp_path / f"{name.replace(' ', '-')}.toml")
        path.write_text(text)
    for result in _run_all([[BIN / "k3repro-runner", "serve", "--config", path] for path in paths]):
        _one_line(result, "k3repro-runner")


def test_the_cli_refuses_bad_input_in_one_line(certs: DevCerts, tmp_path: Path) -> None:
    cluster = '[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "vllm/vllm-openai:kimi-k3"\n'
    (tmp_path / "garbage.db").write_text("this is not a SQLite file " * 100)
    configs = {
        "unbalanced quote": ('store = "k.db"\n' + cluster + 'launch = "vllm serve \'m"\n', ["runs"]),
        "store not SQLite": ('store = "garbage.db"\n' + cluster + 'launch = "vllm serve m"\n', ["runs"]),
        "store not SQLite (show)": ('store = "garbage.db"\n' + cluster + 'launch = "vllm serve m"\n', ["show", "x"]),
        "store a folder": (f'store = "{tmp_path}"\n' + cluster + 'launch = "vllm serve m"\n', ["runs"]),
        "store unwritable": ('store = "/proc/k3repro.db"\n' + cluster + 'launch = "vllm serve m"\n', ["runs"]),
        "missing TLS file": (
            'store = "k.db"\n[tls]\nca = "absent.pem"\n' + cluster + 'launch = "vllm serve m"\n',
            ["start", "cluster-a"],
        ),
        "TLS not PEM": (
            'store = "k.db"\n[tls]\nca = "garbage.db"\n' + cluster + 'launch = "vllm serve m"\n',
            ["runners"],
        ),
        "bad timeout": ('store = "k.db"\nconnect_timeout_s = 0\n' + cluster + 'launch = "vllm serve m"\n', ["runs"]),
    }
    commands: list[list[str | Path]] = []
    for name, (text, args) in configs.items():
        path = tmp_path / f"{name.replace(' ', '-')}.toml"
        path.write_text(text)
        commands.append([BIN / "k3repro", "--config", path, *args])
    speeds = ("0", "-5", "nan", "fast")
    commands += [[BIN / "k3repro", "demo", "--speed", speed] for speed in speeds]
    launches = (("vllm serve 'unbalanced", "--launch: No closing quotation"), ("", "--launch: empty command"))
    commands += [[BIN / "k3repro", "demo", "--launch", launch] for launch, _ in launches]
    results = _run_all(commands)
    for result in results[: len(configs)]:
        _one_line(result, "k3repro")
    assert not (tmp_path / "k.db").exists()  # nothing was created by a refused command
    for result in results[len(configs) : len(configs) + len(speeds)]:
        assert result.returncode == 2 and "Traceback" not in result.stderr and "--speed" in result.stderr
    for result, (_, said) in zip(results[len(configs) + len(speeds) :], launches, strict=True):
        _one_line(result, "k3repro")
        assert said in result.stderr
