"""`slurm`: one exclusive batch job per rerun, running `k3repro-runner serve --once` on the node it gets.

The job writes its runner's port to a file in a shared folder; the node comes from `squeue`. A job still
pending after `queue_wait_s` is cancelled and reported, never waited on forever; release is `scancel`.

The job gets an environment built from an allowlist (`job_env`), never the bot's whole one: its Slack tokens
and anything else it holds stay on the bot's host.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from bot.config import IsolationConfig
from bot.isolation.base import IsolationError, Placement
from kernel.clock import WALL, WallClock

START_S = 60.0  # from RUNNING to the runner's port file: the runner's own start-up
GONE_S = 30.0  # after scancel: how long release waits for the job to leave the queue
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
# The bot's variables a job is given, by name: what any process needs, the redaction key (the isolated
# runner's placeholders then equal the bot's and the original runner's), proxies and CA bundles, and the hub's
# settings and token an engine on the node needs to fetch the weights. Slurm adds its own SLURM_*.
JOB_ENV_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH",
        "K3REPRO_REDACTION_KEY",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    }
)  # fmt: skip
JOB_ENV_PREFIXES = ("LC_", "HF_", "HUGGING_FACE_")


class SlurmProvider:
    name = "slurm"

    def __init__(self, isolation: IsolationConfig, clock: WallClock = WALL) -> None:
        self.config = isolation
        self.clock = clock  # queue waits and polls

    def sbatch_argv(self, rerun_id: str, work: Path) -> list[str]:
        """Never a shell string: every setting is one argument."""
        c = self.config
        runner = c.runner_command or str(Path(sys.executable).with_name("k3repro-runner"))
        argv = [
            "sbatch",
            "--parsable",
            "--exclusive",
            "--nodes=1",
            f"--job-name=k3repro-{rerun_id}",
            f"--time={c.time_limit}",
            f"--output={work / 'job.out'}",
            f"--export={','.join([*job_env(os.environ), f'K3REPRO_RUNNER={runner}'])}",
        ]
        for option, value in (
            ("partition", c.partition),
            ("nodelist", c.nodelist),
            ("reservation", c.reservation),
            ("account", c.account),
            ("constraint", c.constraint),
        ):
            if value:
                argv.append(f"--{option}={value}")
        return [*argv, str(c.script), str(c.runner_config), str(work / "port")]

    async def acquire(self, rerun_id: str) -> Placement:
        assert self.config.work_dir is not None  # the config requires it for slurm
        work = self.config.work_dir / rerun_id
        work.mkdir(parents=True, exist_ok=True)
        job = (await _slurm(*self.sbatch_argv(rerun_id, work))).split(";")[0].strip()
        try:
            node = await self._until_running(job)
            port = await self._port(job, work)
        except BaseException:
            await self.release(Placement(self.name, "", "", job))
            raise
        return Placement(self.name, f"{node}:{port}", f"slurm job {job} on node {node}", job)

    async def _until_running(self, job: str) -> str:
        deadline = self.clock.monotonic() + self.config.queue_wait_s
        while True:
            state, node, reason = await _job(job)
            if state == "RUNNING" and node:
                return node
            if state not in LIVE_STATES:
                raise IsolationError(f"slurm job {job} ended before its runner came up ({state or 'gone'})")
            if self.clock.monotonic() >= deadline:
                raise IsolationError(
                    f"slurm job {job} did not start within {self.config.queue_wait_s:g} s "
                    f"({state}: {reason or 'no reason given'}); it was cancelled"
                )
            await self.clock.sleep(self.config.poll_s)

    async def _port(self, job: str, work: Path) -> int:
        port_file = work / "port"
        deadline = self.clock.monotonic() + START_S
        while not port_file.exists():
            state, _, _ = await _job(job)
            if state not in LIVE_STATES or self.clock.monotonic() >= deadline:
                tail = _tail(work / "job.out")
                raise IsolationError(f"slurm job {job}: the runner did not come up ({state or 'gone'}){tail}")
            await self.clock.sleep(min(self.config.poll_s, 0.2))
        return int(port_file.read_text().strip())

    async def release(self, placement: Placement) -> None:
        job = placement.handle
        try:
            await _slurm("scancel", job)
        except IsolationError:
            if (await _job(job))[0] in LIVE_STATES:
                raise  # a job that ended by itself needs no scancel; one still live does
        deadline = self.clock.monotonic() + GONE_S
        while True:
            if (await _job(job))[0] not in LIVE_STATES or self.clock.monotonic() >= deadline:
                return
            await self.clock.sleep(0.2)


def job_env(environ: Mapping[str, str]) -> list[str]:
    """The names of `environ`'s variables a job gets (`--export=NAME,...`: sbatch copies each value from its
    own environment, so none is on a command line); a name with a character Slurm's list cannot carry is left
    out."""
    return sorted(
        name
        for name in environ
        if (name in JOB_ENV_NAMES or name.startswith(JOB_ENV_PREFIXES))
        and name.isascii()
        and name.replace("_", "").isalnum()
    )


async def _job(job: str) -> tuple[str, str, str]:
    """(state, node, reason) as squeue shows it; ("", "", "") once Slurm no longer lists the job."""
    process = await asyncio.create_subprocess_exec(
        "squeue", "--noheader", f"--jobs={job}", "--format=%T|%N|%r",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate()
    line = out.decode().strip()
    if process.returncode != 0 or not line:
        return "", "", ""  # squeue answers "Invalid job id" once a finished job is purged
    state, node, reason = [*line.split("|"), "", ""][:3]
    return state, node, "" if reason == "None" else reason


async def _slurm(*argv: str) -> str:
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except FileNotFoundError:
        raise IsolationError(
            f"{argv[0]} is not installed here (the slurm provider needs Slurm's client tools)"
        ) from None
    out, err = await process.communicate()
    if process.returncode != 0:
        message = (err.decode().strip().splitlines() or [f"exit {process.returncode}"])[-1]
        raise IsolationError(f"{argv[0]} failed: {message}")
    return out.decode()


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f"; its output ends: {lines[-1]}" if lines else ""
