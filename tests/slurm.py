"""A real single-node Slurm for tests: munged, slurmctld and slurmd (Debian `slurm-wlm`, `munge`) started in
the foreground from a generated munge key and slurm.conf in a temporary folder, and stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from runner.ports import free_port
from tests.procs import terminate

UP = "k3"  # the partition that runs jobs
DOWN = "k3down"  # a partition that is DOWN: a job there never starts
START_S = 30.0


@dataclass(frozen=True)
class Slurm:
    conf: Path
    env: dict[str, str]  # what clients (sbatch, squeue, scancel) need: SLURM_CONF

    def jobs(self) -> list[str]:
        """Every job Slurm still lists as pending or running."""
        out = subprocess.run(
            ["squeue", "--noheader", "--format=%i %T"], env=self.env, capture_output=True, text=True, check=True
        )
        return out.stdout.split("\n")[:-1]


def _conf(root: Path) -> str:
    cpus = os.cpu_count() or 1
    memory_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return f"""\
ClusterName=k3test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
SlurmctldPort={free_port("127.0.0.1")}
SlurmdPort={free_port("127.0.0.1")}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=2
KillWait=5
NodeName=localhost CPUs={cpus} RealMemory={memory_mib - 512} State=UNKNOWN
PartitionName={UP} Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName={DOWN} Nodes=localhost MaxTime=INFINITE State=DOWN
"""


@contextlib.contextmanager
def running_slurm(root: Path) -> Iterator[Slurm]:
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not installed: `make setup` installs slurm-wlm and munge")
    for folder in ("state", "spool"):
        (root / folder).mkdir(parents=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons: list[subprocess.Popen[bytes]] = []
    logs = (root / "daemons.log").open("wb")
    try:
        daemons.append(
            subprocess.Popen(
                ["munged", "--foreground", f"--key-file={key}", f"--socket={root}/munge.socket",
                 f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed",
                 "--force"],
                stdout=logs, stderr=logs,
            )
        )  # fmt: skip
        _until(lambda: (root / "munge.socket").exists(), "munged did not create its socket")
        daemons.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env, stdout=logs, stderr=logs))
        daemons.append(
            subprocess.Popen(["slurmd", "-D", "-N", "localhost", "-f", str(conf)], env=env, stdout=logs, stderr=logs)
        )
        slurm = Slurm(conf, env)

        def idle() -> bool:
            out = subprocess.run(["sinfo", "--noheader", f"--partition={UP}", "--format=%T"], env=env,
                                 capture_output=True, text=True)  # fmt: skip
            return out.stdout.strip() == "idle"

        _until(idle, f"the Slurm node did not become idle; see {root}/slurmctld.log and slurmd.log")
        yield slurm
    finally:
        for daemon in reversed(daemons):
            terminate(daemon, 10)
        logs.close()


def _until(ready: Callable[[], bool], problem: str) -> None:
    deadline = time.monotonic() + START_S
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(problem)
        time.sleep(0.2)
