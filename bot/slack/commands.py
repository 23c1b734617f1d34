"""`/k3repro` command text → a command, or an error that says what was wrong and what is accepted.

Pure and fast: it runs before the ack. What each command takes, its usage and its help line come from
bot/operations.py, the registry the terminal's parser is built from too.
"""

from __future__ import annotations

import html
import shlex
from dataclasses import dataclass

from bot import rich
from bot.operations import SLACK, Operation, on

MAX_TEXT = 1000


class CommandError(ValueError):
    """Malformed command text; the message is shown to the user as is."""


# The operations `/k3repro` offers (bot/operations.py declares them for both front-ends)
OPERATIONS: dict[str, Operation] = on(SLACK)


@dataclass(frozen=True)
class Command:
    name: str
    args: dict[str, str]

    @property
    def operation(self) -> Operation:
        return OPERATIONS[self.name]


def accepted() -> str:
    return ", ".join(f"`{name}`" for name in OPERATIONS)


def parse(text: str) -> Command:
    text = html.unescape(text).strip()  # Slack escapes &, < and >
    if len(text) > MAX_TEXT:
        raise CommandError(f"the command is {len(text)} characters long; at most {MAX_TEXT} are accepted")
    name, _, tail = text.partition(" ")
    if not name:
        return Command("help", {})
    operation = OPERATIONS.get(name.lower())
    if operation is None:
        raise CommandError(f"unknown subcommand `{name}`. Accepted: {accepted()}")
    try:
        args = _arguments(operation, tail)
    except CommandError as exc:
        raise CommandError(f"{exc}. Usage: `{operation.usage()}`") from None
    return Command(name.lower(), args)


def _arguments(operation: Operation, tail: str) -> dict[str, str]:
    required = tuple(arg.name for arg in operation.args if not arg.optional and not arg.rest)
    optional = tuple(arg.name for arg in operation.args if arg.optional)
    rest = next((arg.name for arg in operation.args if arg.rest), "")
    options = tuple(option.name for option in operation.options_on(SLACK))
    if rest:
        head = tail.split(None, len(required))
        words, text = head[: len(required)], " ".join(head[len(required) :]).strip()
        if len(words) < len(required):
            raise CommandError(f"missing {' '.join(n.upper() for n in required[len(words) :])}")
        if not text:
            raise CommandError(f"missing {rest.upper()}")
        return {**dict(zip(required, words, strict=True)), rest: text}
    try:
        tokens = shlex.split(tail)
    except ValueError as exc:
        raise CommandError(f"cannot read the arguments ({exc})") from None
    args: dict[str, str] = {}
    positional: list[str] = []
    while tokens:
        token = tokens.pop(0)
        if token.startswith("--"):
            option = token[2:]
            if option not in options:
                allowed = ", ".join(f"--{o}" for o in options) or "none"
                raise CommandError(f"unknown option `{token}` (options: {allowed})")
            if not tokens or tokens[0].startswith("--"):
                raise CommandError(f"`{token}` needs a value")
            args[option] = tokens.pop(0)
        else:
            positional.append(token)
    names = required + optional
    if len(positional) < len(required):
        raise CommandError(f"missing {' '.join(n.upper() for n in required[len(positional) :])}")
    if len(positional) > len(names):
        raise CommandError(f"unexpected `{' '.join(positional[len(names) :])}`")
    args.update(zip(names, positional, strict=False))
    for arg in operation.args:
        if arg.choices and args.get(arg.name) not in arg.choices:
            raise CommandError(f"`{args.get(arg.name)}` is not accepted here (expected: {', '.join(arg.choices)})")
    return args


def help_text(command: str) -> rich.Text:
    lines = [
        rich.text(rich.code(f"{command} {operation.usage()}"), f" — {operation.help(SLACK)}")
        for operation in OPERATIONS.values()
    ]
    return rich.joined(lines)
