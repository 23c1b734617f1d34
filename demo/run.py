"""`k3repro demo`: the whole path on this machine — runner (sim backend) and bot core over mTLS on loopback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from bot.commands.common import CommandError, EventPrinter, coordinator, operator
from bot.config import parse_bot_config
from bot.coordinator import Coordinator
from bot.minimize import start_minimize
from bot.render import run_header
from bot.report import run_report
from bot.store import Store
from kernel.tls import write_dev_certs
from kernel.toml_reader import ConfigError, read_toml
from runner.config import parse_runner_config
from runner.plugins import engine_plugin

HOST_INSTALL = "host-install"  # what `--launch` runs is the host's own vLLM install, not an image


def run(args: argparse.Namespace) -> int:
    try:
        scenario = Path(engine_plugin("sim").scenario(args.scenario))
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    with _workdir() as tmp:
        out = io.StringIO() if args.json else sys.stdout
        report = asyncio.run(
            demo(tmp, scenario, args.speed, args.logs, out, launch=args.launch, minimize=args.minimize)
        )
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    """The demo's temporary folder (its store, certificates, private keys), removed when the demo ends; and a
    guard process for a demo that is killed (SIGKILL runs no `finally`): it waits for this process's end (its
    standard input closes, however this process ends), then kills the engines of the demo's runs and removes the
    folder. The guard has its own session: a Ctrl-C in the terminal is the demo's to handle."""
    with tempfile.TemporaryDirectory(prefix="k3repro-demo-") as tmp:
        code = "import sys; from demo.guard import guard; guard(sys.argv[1])"
        guard = subprocess.Popen([sys.executable, "-c", code, tmp], stdin=subprocess.PIPE, start_new_session=True)
        yield Path(tmp)
    assert guard.stdin is not None
    guard.stdin.close()  # the demo cleaned up after itself: the guard finds nothing left


def data_file() -> dict[str, Any]:
    return read_toml(Path(str(resources.files("bot.data").joinpath("demo.toml"))))


async def demo(
    workdir: Path,
    scenario: Path,
    speed: float | None,
    logs: bool,
    out: TextIO,
    launch: str | None = None,
    engine_settings: dict[str, Any] | None = None,
    minimize: bool = False,
) -> dict[str, Any]:
    """Runs the whole method on the scenario's deployment (or on a real vLLM's `launch`); returns the run report
    (with `"minimize"`, the minimize run's report, when `minimize` and the ladder named a trigger)."""
    try:
        deployment = engine_plugin("sim").deployment(str(scenario))
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    data = data_file()
    certs = write_dev_certs(workdir / "certs")
    runner_data = data["runner"]
    runner_data["listen"] = "127.0.0.1:0"
    runner_data["state_dir"] = str(workdir / "runner-state")
    runner_data["tls"] = {"cert": str(certs.runner_cert), "key": str(certs.runner_key), "client_ca": str(certs.ca)}
    engine = runner_data["engine"]
    engine["sim"]["scenario"] = str(scenario)
    if speed is not None:
        engine["sim"]["speed"] = speed
    cluster = data["clusters"]["cluster-a"]
    cluster["launch"] = list(deployment.argv)
    if deployment.image:
        cluster["image"] = deployment.image
        runner_data["allowed_images"].append(deployment.image)  # the deployment's own image, as its cluster allows
    if deployment.request is not None:
        cluster["request"]["api"], cluster["request"]["body"] = deployment.api, dict(deployment.request)
    if launch is not None:
        _on_this_host(data, launch)
    runner_data["engine"].update(engine_settings or {})  # the bench's plans ([engine] keys of runner.toml)
    from runner.daemon import RunnerDaemon  # the runner's gRPC server only where the demo runs one

    daemon = RunnerDaemon(parse_runner_config(runner_data, base=workdir, origin="demo runner"))
    port = await daemon.start()
    try:
        clusters = data["clusters"]
        for cluster in clusters.values():
            cluster["runners"] = [f"127.0.0.1:{port}"]
        bot_data = {
            "store": str(workdir / "k3repro.db"),
            "tls": {"ca": str(certs.ca), "cert": str(certs.bot_cert), "key": str(certs.bot_key)},
            "clusters": clusters,
        }
        config = parse_bot_config(bot_data, base=workdir, origin="demo bot")
        host = f"sim host '{scenario.name.removesuffix('.toml')}'" if launch is None else "this host's vLLM"
        print(f"k3repro demo: runner gpu-a1 ({host}) on 127.0.0.1:{port}, mTLS, store {config.store}", file=out)
        print("$ k3repro start cluster-a\n", file=out)
        async with coordinator(config) as core:
            started = await core.start("cluster-a", operator(), via="demo")
            print(f"run {started.run_id} · cluster cluster-a · runner {started.runner}", file=out, flush=True)
            printer = EventPrinter(out, logs=logs)
            await core.follow(started, printer, printer.reconnecting)
            report = run_report(started.run_id, await core.store.call(Store.events, started.run_id))
            if minimize and report["trigger_step"]:
                report["minimize"] = await _minimize(core, started.run_id, printer, out)
        print("\n$ k3repro runs", file=out)
        store = Store(config.store)
        print(run_header(store.get_run(started.run_id)), file=out)
        store.close()
    finally:
        await daemon.stop("demo finished")
    return report


async def _minimize(core: Coordinator, run_id: str, printer: EventPrinter, out: TextIO) -> dict[str, Any]:
    print(f"\n$ k3repro minimize {run_id}\n", file=out)
    started = await start_minimize(core, run_id, operator(), via="demo")
    print(f"minimize run {started.run_id} of {run_id} · runner {started.runner}", file=out, flush=True)
    await core.follow(started, printer, printer.reconnecting)
    return run_report(started.run_id, await core.store.call(Store.events, started.run_id))


def _on_this_host(data: dict[str, Any], launch: str) -> None:
    """The demo's runner on the process backend, launching `launch` (a real vLLM) in real seconds."""
    try:
        argv = shlex.split(launch)
    except ValueError as exc:
        raise CommandError(f"--launch: {exc}") from None
    if not argv:
        raise CommandError("--launch: empty command")
    data["runner"]["engine"] = {"backend": "process", "executables": [argv[0]], **data["real_engine"]}
    data["runner"]["allowed_images"].append(HOST_INSTALL)
    data["clusters"]["cluster-a"].update(launch=argv, image=HOST_INSTALL)
