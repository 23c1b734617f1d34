"""`k3repro`: the terminal front-end of the bot core.

Its parser is built from bot/operations.py, the registry Slack's `/k3repro` parser is built from too. The first
level is that table alone: `k3repro --help` imports no command, and a command line imports only its own
command's module (the store, gRPC, the analyzer come with the commands that use them).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.operations import CLI, Operation, ValueType, on

# The same names as bot/config.py's DEFAULT_CONFIG and CONFIG_ENV (a test keeps them so): importing bot.config
# loads the TLS stack, which `--help` does not need.
CONFIG_HELP = "bot config (default: $K3REPRO_CONFIG or ./k3repro.toml)"

# The commands `k3repro` offers, in the order `k3repro --help` lists them (bot/operations.py declares them for
# both front-ends: their arguments, options and help lines come from there)
COMMANDS: dict[str, Operation] = on(CLI)


@functools.cache  # built once: argparse looks up a translation on disk for every help text it adds
def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser of `command` (its arguments in full, its handler imported); every other command a
    placeholder that takes anything, which is all `k3repro --help` and finding the command need."""
    parser = argparse.ArgumentParser(
        prog="k3repro", description="Reproduce vLLM serving failures one change at a time."
    )
    parser.add_argument("--config", type=Path, help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, operation in COMMANDS.items():
        if name == command:
            _add(sub, operation)
        else:
            sub.add_parser(name, help=operation.help(CLI), add_help=False)
    return parser


def _add(sub: argparse._SubParsersAction[argparse.ArgumentParser], operation: Operation) -> None:
    """`operation`'s terminal parser, from its declaration alone; its handler (module:function) as `func`."""
    parser = sub.add_parser(operation.name, help=operation.help(CLI), description=operation.description or None)
    if operation.actions:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        for action in operation.actions:
            _add(actions, action)
        return
    for arg in operation.args:
        if len(arg.choices) == 1:  # Slack's literal word is the terminal's required flag: `--isolated`
            parser.add_argument(
                f"--{arg.choices[0]}", dest=arg.name, action="store_const", const=arg.choices[0], required=True,
                help=arg.help or None,
            )  # fmt: skip
        else:
            nargs = "+" if arg.rest else "?" if arg.optional else None
            parser.add_argument(arg.name, metavar=arg.metavar, nargs=nargs, type=TYPES[arg.type], help=arg.help or None)
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for option in operation.options_on(CLI):
        target: argparse._ActionsContainer = parser
        if option.exclusive:
            if option.exclusive not in groups:
                groups[option.exclusive] = parser.add_mutually_exclusive_group()
            target = groups[option.exclusive]
        flags = [option.short, f"--{option.name}"] if option.short else [f"--{option.name}"]
        if not option.metavar:
            target.add_argument(*flags, action="store_true", help=option.help)
            continue
        target.add_argument(
            *flags, metavar=option.metavar, type=TYPES[option.type], required=option.required, help=option.help,
            action="append" if option.repeat else "store", default=[] if option.repeat else option.default,
        )  # fmt: skip
    module, _, function = operation.cli.partition(":")
    parser.set_defaults(func=getattr(importlib.import_module(module), function))


def positive(text: str) -> float:
    """argparse's type for a factor above 0 (demo's --speed: 0 would never end, a negative one is meaningless)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


TYPES: dict[ValueType, Callable[[str], Any]] = {"str": str, "int": int, "path": Path, "positive": positive}


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
    from kernel.toml_reader import ConfigError

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
