"""`k3repro demo`: the whole path on this machine — runner (sim backend) and bot core over mTLS on loopback."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from importlib import resources
from pathlib import Path

from bot.commands.common import EventPrinter, coordinator, operator
from bot.config import parse_bot_config
from bot.render import run_header
from bot.store import Store
from runner.config import parse_runner_config
from runner.daemon import RunnerDaemon
from runner.tls import write_dev_certs
from runner.toml_reader import read_toml


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("demo", help="run the embedded demo end to end on this machine")
    parser.add_argument(
        "--scenario", default="demo", help="built-in sim scenario for the runner's host (default: demo)"
    )
    parser.add_argument("--speed", type=float, help="sim speed factor (default from the demo config)")
    parser.add_argument("--logs", action="store_true", help="also print the engine's log")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="k3repro-demo-") as tmp:
        return asyncio.run(demo(Path(tmp), args.scenario, args.speed, args.logs))


async def demo(workdir: Path, scenario: str, speed: float | None, logs: bool) -> int:
    data = read_toml(Path(str(resources.files("bot.data").joinpath("demo.toml"))))
    certs = write_dev_certs(workdir / "certs")
    runner_data = data["runner"]
    runner_data["listen"] = "127.0.0.1:0"
    runner_data["state_dir"] = str(workdir / "runner-state")
    runner_data["tls"] = {"cert": str(certs.runner_cert), "key": str(certs.runner_key), "client_ca": str(certs.ca)}
    runner_data["engine"]["sim"]["scenario"] = scenario
    if speed is not None:
        runner_data["engine"]["sim"]["speed"] = speed
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
        print(f"k3repro demo: runner gpu-a1 (sim host '{scenario}') on 127.0.0.1:{port}, mTLS, store {config.store}")
        print("$ k3repro start cluster-a\n")
        async with coordinator(config) as core:
            started = await core.start("cluster-a", operator(), via="demo")
            print(f"run {started.run_id} · cluster cluster-a · runner {started.runner}", flush=True)
            await core.follow(started, EventPrinter(logs=logs))
        print("\n$ k3repro runs")
        store = Store(config.store)
        print(run_header(store.get_run(started.run_id)))
        store.close()
    finally:
        await daemon.stop("demo finished")
    return 0
