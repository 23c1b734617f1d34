"""`k3repro-bot`: the bot process. `serve` runs the Slack bot; `resume` only follows the active runs to their end.
`--config` goes before or after the subcommand; `--check-config` checks the config as that subcommand would start
(the TLS files, and for `serve` the Slack settings), touches nothing and exits 0."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from bot.config import CONFIG_ENV, DEFAULT_CONFIG, BotConfig, IsolationConfig, check_tls, config_path, load_bot_config
from bot.coordinator import Coordinator
from bot.rerun import RerunOutcome, verdict_lines
from bot.resume import Shown, resume_active
from bot.store import AsyncStore, Run
from kernel.toml_reader import ConfigError
from protos import runner_pb2 as pb

log = logging.getLogger("k3repro.bot")


def checked_config(config_file: Path, *, slack: bool) -> BotConfig:
    """The config as a start needs it, refused in one line before anything (the store included) is created:
    the file itself, the TLS files, and for the Slack bot its [slack] settings."""
    config = load_bot_config(config_file)
    check_tls(config.tls)
    if slack and config.slack is None:
        raise ConfigError(
            f"{config_file}: no [slack] table, and $SLACK_BOT_TOKEN and $SLACK_SIGNING_SECRET are not both set: "
            "the Slack bot needs its bot token and signing secret"
        )
    if slack and config.slack is not None:
        _, sep, port = config.slack.listen.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"{config_file}: [slack] listen must be HOST:PORT, got {config.slack.listen!r}")
    return config


def check_config(config_file: Path, *, slack: bool) -> str:
    """`--check-config`: what a start would check, and the files an isolated rerun will need from this host (the
    Slurm script, the Kubernetes Job template and credentials); the summary line when all is well."""
    config = checked_config(config_file, slack=slack)
    if config.store.parent.exists() and not config.store.parent.is_dir():
        raise ConfigError(f"{config_file}: store {str(config.store)!r}: {config.store.parent} is not a directory")
    isolations = {c.isolation for c in config.clusters.values() if c.isolation is not None}
    for isolation in sorted(isolations, key=repr):
        _check_isolation_files(config_file, isolation)
    tls = "mTLS" if config.tls is not None and config.tls.cert is not None else "TLS" if config.tls else "no TLS"
    where = f", Slack on {config.slack.listen}" if slack and config.slack is not None else ""
    return f"{len(config.clusters)} cluster(s) ({', '.join(sorted(config.clusters))}), runners over {tls}{where}"


def _check_isolation_files(config_file: Path, isolation: IsolationConfig) -> None:
    for key in ("script", "job_template", "token_file", "ca_file"):
        path = getattr(isolation, key)
        if path is not None and not path.is_file():
            raise ConfigError(f"{config_file}: [isolation] {key}: {path} is not a readable file on this host")


async def resume_all(config_file: Path) -> int:
    """Follows every run the store holds as active until each ends (what a restarted bot does first)."""
    config = checked_config(config_file, slack=False)
    store = AsyncStore(config.store, config.retention)
    try:
        return 0 if await resume_runs(Coordinator(config, store)) else 1
    finally:
        store.close()


async def resume_runs(core: Coordinator) -> bool:
    """Every active run to its end, each event and verdict logged (the one resume path, bot/resume.py).
    False when some run could not be followed."""
    follows = await resume_active(core, _logged)
    log.info("resuming %d active run(s)", len(follows))
    return all(await asyncio.gather(*follows.values()))


async def _logged(run: Run) -> Shown:
    async def note(event: pb.RunEvent) -> None:
        log.info("run %s seq %d %s", run.id, event.seq, event.WhichOneof("payload"))

    async def verdict(outcome: RerunOutcome) -> None:
        log.info("rerun %s of %s: %s", run.id, run.rerun_of, " ".join(verdict_lines(outcome)))

    return Shown(on_event=note, verdict=verdict)


async def serve(config_file: Path) -> int:
    """The Slack bot until SIGTERM/SIGINT; runs keep going on their runners and are resumed by the next start."""
    from bot.web import serving  # Slack libraries only where the Slack bot runs

    config = checked_config(config_file, slack=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serving(config, ready=False) as served:
        mode = "Socket Mode and HTTP" if served.bot.settings.app_token else "HTTP"
        log.info("k3repro bot serving (%s) on port %d", mode, served.port)
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({stopping, served.started}, return_when=asyncio.FIRST_COMPLETED)
        if served.started.done():
            served.started.result()  # a start that failed for good (a refused token) ends the bot: one line
            await stopping
        stopping.cancel()
    return 0


CONFIG_HELP = f"bot config (default: ${CONFIG_ENV} or ./{DEFAULT_CONFIG})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k3repro-bot", description="k3repro bot process")
    parser.add_argument("--config", type=Path, help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("resume", "follow every active run in the store until it ends"),
        ("serve", "run the Slack bot: HTTP (and Socket Mode with an app token), /healthz, /metrics"),
    ):
        command = sub.add_parser(name, help=help_text)
        # SUPPRESS: given after the subcommand it wins; not given there, it leaves the one before it alone
        command.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=CONFIG_HELP)
        command.add_argument(
            "--check-config",
            action="store_true",
            help="check the config as this command would start (TLS files included), exit 0; nothing is created",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = config_path(args.config)
    try:
        if args.check_config:
            print(f"k3repro-bot: {path}: ok: {check_config(path, slack=args.command == 'serve')}")
            return 0
        work = serve if args.command == "serve" else resume_all
        return asyncio.run(work(path))
    except ConfigError as exc:
        print(f"k3repro-bot: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
