"""A Slurm job gets the bot's allowlisted variables, never its whole environment: on a real single-node Slurm,
a job submitted exactly as the bot submits an isolated rerun (its sbatch argv) records its environment; the
bot's Slack tokens and a cloud key planted in the submitting environment are not in it, the allowlisted
variables (PATH, HOME, LANG, the redaction key, the hub token) are, and no value is on sbatch's command line."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.config import IsolationConfig
from bot.isolation.slurm import SlurmProvider, job_env
from tests.slurm import UP, Slurm, running_slurm

PLANTED = {  # what the bot holds and a job must never get
    "SLACK_BOT_TOKEN": "xoxb-1234567890-planted-bot-token",
    "SLACK_SIGNING_SECRET": "planted-signing-secret-0451",
    "AWS_SECRET_ACCESS_KEY": "planted-aws-secret-0451",
    "K3REPRO_CONFIG": "/etc/k3repro/planted.toml",
}
PASSED = {  # what a job gets
    "K3REPRO_REDACTION_KEY": "site-redaction-key",
    "HF_TOKEN": "hf_PassedToTheNode0451",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
}
SCRIPT = '#!/bin/bash\nenv -0 > "$2.tmp" && mv "$2.tmp" "$2"\n'  # called as the real script is: CONFIG PORT_FILE


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    with running_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def test_the_allowlist_keeps_the_basics_and_drops_the_rest() -> None:
    environ = {"PATH": "/bin", "HOME": "/h", "LANG": "C", "LC_TIME": "C", "HF_HOME": "/hub", **PLANTED}
    environ |= {"VLLM_API_KEY": "k", "NCCL_DEBUG": "INFO", "K3REPRO_REDACTION_KEY": "k", "BAD,NAME": "x"}
    assert job_env(environ) == ["HF_HOME", "HOME", "K3REPRO_REDACTION_KEY", "LANG", "LC_TIME", "PATH"]


def test_a_job_gets_only_the_allowlisted_environment(
    slurm: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**PLANTED, **PASSED, "SLURM_CONF": str(slurm.conf)}.items():
        monkeypatch.setenv(name, value)
    script = tmp_path / "env.sbatch"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    isolation = IsolationConfig(
        "slurm", partition=UP, time_limit="00:02:00", script=script, runner_config=tmp_path / "runner.toml"
    )
    argv = SlurmProvider(isolation).sbatch_argv("envcheck", tmp_path)
    assert not [value for value in {**PLANTED, **PASSED}.values() if any(value in arg for arg in argv)]
    subprocess.run(argv, check=True, capture_output=True, env=os.environ)
    out = tmp_path / "port"
    deadline = time.monotonic() + 60
    while not out.exists():
        assert time.monotonic() < deadline, (
            (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
        )
        time.sleep(0.2)
    env = dict(entry.split("=", 1) for entry in out.read_text().split("\0") if "=" in entry)
    assert [name for name in PLANTED if name in env] == []
    assert not [value for value in PLANTED.values() if value in out.read_text()]
    assert {name: env.get(name) for name in PASSED} == PASSED
    assert env["PATH"] == os.environ["PATH"] and env["HOME"] == os.environ["HOME"]
    assert env["K3REPRO_RUNNER"].endswith("k3repro-runner")
