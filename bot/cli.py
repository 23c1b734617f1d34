"""`k3repro`: the terminal front-end of the bot core.

The parser's first level is this module's table alone: `k3repro --help` imports no command, and a command line
imports only its own command's module (the store, gRPC, the analyzer come with the commands that use them).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from pathlib import Path

# The same names as bot/config.py's DEFAULT_CONFIG and CONFIG_ENV (a test keeps them so): importing bot.config
# loads the TLS stack, which `--help` does not need.
CONFIG_HELP = "bot config (default: $K3REPRO_CONFIG or ./k3repro.toml)"

# Each command: the module under bot/commands that defines it (its add_parser) and its one-line help, in the
# order `k3repro --help` lists them (a test keeps these help lines the modules' own).
COMMANDS: dict[str, tuple[str, str]] = {
    "start": ("start", "start a run on a cluster and follow it live"),
    "watch": ("start", "follow a run again, from where this store stopped"),
    "runs": ("runs", "list recent runs"),
    "show": ("runs", "show a run and everything it recorded"),
    "cancel": ("runs", "cancel an active run"),
    "runners": ("runs", "the runners of each cluster and what they are doing"),
    "note": ("note", "add to a cluster's change log (time + what changed)"),
    "rerun": ("rerun", "rerun a run's frozen case on an isolated node; prints the verdict"),
    "minimize": ("minimize", "shrink a run's flags to a 1-minimal set that fails the same way (a run of its own)"),
    "report": ("report", "write a run's hand-off report: one Markdown document to act on"),
    "bundle": ("bundle", "export or import a run's frozen bundle (tar.gz with a sha256 manifest)"),
    "demo": ("demo", "run the embedded demo end to end on this machine"),
    "dev-certs": ("dev_certs", "write a local CA plus runner and bot certificates (not for production)"),
    "analyze": ("analyze", "find the first error of a vLLM log: phase, category, root-cause line, secondary OOM"),
    "fingerprint": (
        "fingerprint",
        "record this host's scene: OS, NVML, image, versions that load, env (secrets redacted), sha256",
    ),
    "check": ("check", "check a fingerprint against a model's compatibility baseline (e.g. kimi-k3)"),
    "diff": ("diff", "field-level differences between two fingerprints (driver, CUDA, digest, versions, GPUs, env)"),
}


@functools.cache  # built once: argparse looks up a translation on disk for every help text it adds
def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser of `command` (its module's subcommands in full); every other command a placeholder that
    takes anything, which is all `k3repro --help` and finding the command need."""
    parser = argparse.ArgumentParser(
        prog="k3repro", description="Reproduce vLLM serving failures one change at a time."
    )
    parser.add_argument("--config", type=Path, help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if command is not None:
        importlib.import_module(f"bot.commands.{COMMANDS[command][0]}").add_parser(sub)
    for name, (_, help_text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    known, _ = build_parser().parse_known_args(argv)  # which command (or --help, or a usage error)
    return build_parser(known.command).parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except BrokenPipeError:  # `k3repro runs | head -1`: the reader has what it wanted
        _stdout_to_devnull()
        return 141  # as a shell reports a command ended by SIGPIPE
    except KeyboardInterrupt:  # a command that leaves something behind says so itself (start, watch, rerun)
        left = INTERRUPTED.get(args.command, "what it had done before stays done")
        print(f"\nk3repro {args.command}: interrupted; {left}", file=sys.stderr)
        return 130
    except Exception as exc:
        if (message := _one_line(exc)) is None:
            raise
        print(f"k3repro: {message}", file=sys.stderr)
        return 2
    return code


# What an interrupted command leaves, said truthfully; start, watch, minimize and rerun say it themselves
INTERRUPTED = {
    **dict.fromkeys(("show", "runners", "analyze", "fingerprint", "check", "diff"), "nothing was changed"),
    "demo": "its runner and engine were stopped and its temporary folder removed",
}


def _one_line(exc: Exception) -> str | None:
    """The one-line message of an error a command may end with (exit 2), or None for a bug."""
    import sqlite3  # only on an error: the modules that raise these are loaded by then

    from bot.commands.common import CommandError
    from bot.store import StoreUnavailable
    from runner.toml_reader import ConfigError

    if isinstance(exc, CommandError | ConfigError | StoreUnavailable):
        return str(exc)
    if isinstance(exc, sqlite3.Error):  # a full or read-only disk, a file that is not a store
        return f"the run store cannot be used: {exc}"
    return None


def _stdout_to_devnull() -> None:
    """Standard output on /dev/null: what is left in its buffer goes nowhere instead of failing at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a descriptor (a test's capture)
        pass


if __name__ == "__main__":
    sys.exit(main())
