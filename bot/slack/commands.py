"""`/k3repro` command text → a command, or an error that says what was wrong and what is accepted.

Pure and fast: it runs before the ack.
"""

from __future__ import annotations

import html
import shlex
from dataclasses import dataclass, field

MAX_TEXT = 1000


class CommandError(ValueError):
    """Malformed command text; the message is shown to the user as is."""


@dataclass(frozen=True)
class Spec:
    usage: str
    summary: str
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # --name VALUE
    rest: str = ""  # a trailing free-text argument
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    operates: bool = False  # changes something: only operators, only in the cluster's channels


SPECS: dict[str, Spec] = {
    "start": Spec(
        "start CLUSTER [--profile P] [--image REF]",
        "start a run on the cluster; its thread tells the story",
        required=("cluster",),
        options=("profile", "image"),
        operates=True,
    ),
    "status": Spec(
        "status [RUN]", "the active runs of this channel's clusters (to their operators), or one", optional=("run",)
    ),
    "runs": Spec("runs", "the latest runs of this channel's clusters (to their operators)"),
    "cancel": Spec("cancel RUN", "cancel an active run", required=("run",), operates=True),
    "rerun": Spec(
        "rerun RUN isolated",
        "rerun the frozen case on an isolated node",
        required=("run", "where"),
        choices={"where": ("isolated",)},
        operates=True,
    ),
    "minimize": Spec(
        "minimize RUN",
        "shrink a finished run's flags to a 1-minimal set that fails the same way (a run of its own)",
        required=("run",),
        operates=True,
    ),
    "runners": Spec("runners [CLUSTER]", "every runner: reachable, idle or busy", optional=("cluster",)),
    "baseline": Spec("baseline [PROFILE]", "the compatibility baseline a run checks against", optional=("profile",)),
    "note": Spec(
        "note CLUSTER TEXT", "add to the cluster's change log", required=("cluster",), rest="text", operates=True
    ),
    "help": Spec("help", "this list"),
}


@dataclass(frozen=True)
class Command:
    name: str
    args: dict[str, str]

    @property
    def spec(self) -> Spec:
        return SPECS[self.name]


def accepted() -> str:
    return ", ".join(f"`{name}`" for name in SPECS)


def parse(text: str) -> Command:
    text = html.unescape(text).strip()  # Slack escapes &, < and >
    if len(text) > MAX_TEXT:
        raise CommandError(f"the command is {len(text)} characters long; at most {MAX_TEXT} are accepted")
    name, _, tail = text.partition(" ")
    if not name:
        return Command("help", {})
    spec = SPECS.get(name.lower())
    if spec is None:
        raise CommandError(f"unknown subcommand `{name}`. Accepted: {accepted()}")
    try:
        args = _arguments(spec, tail)
    except CommandError as exc:
        raise CommandError(f"{exc}. Usage: `{spec.usage}`") from None
    return Command(name.lower(), args)


def _arguments(spec: Spec, tail: str) -> dict[str, str]:
    if spec.rest:
        head = tail.split(None, len(spec.required))
        words, rest = head[: len(spec.required)], " ".join(head[len(spec.required) :]).strip()
        if len(words) < len(spec.required):
            raise CommandError(f"missing {' '.join(n.upper() for n in spec.required[len(words) :])}")
        if not rest:
            raise CommandError(f"missing {spec.rest.upper()}")
        return {**dict(zip(spec.required, words, strict=True)), spec.rest: rest}
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
            if option not in spec.options:
                allowed = ", ".join(f"--{o}" for o in spec.options) or "none"
                raise CommandError(f"unknown option `{token}` (options: {allowed})")
            if not tokens or tokens[0].startswith("--"):
                raise CommandError(f"`{token}` needs a value")
            args[option] = tokens.pop(0)
        else:
            positional.append(token)
    names = spec.required + spec.optional
    if len(positional) < len(spec.required):
        raise CommandError(f"missing {' '.join(n.upper() for n in spec.required[len(positional) :])}")
    if len(positional) > len(names):
        raise CommandError(f"unexpected `{' '.join(positional[len(names) :])}`")
    args.update(zip(names, positional, strict=False))
    for name, allowed_values in spec.choices.items():
        if args.get(name) not in allowed_values:
            raise CommandError(f"`{args.get(name)}` is not accepted here (expected: {', '.join(allowed_values)})")
    return args


def help_text(command: str) -> str:
    lines = [f"`{command} {spec.usage}` — {spec.summary}" for spec in SPECS.values()]
    return "\n".join(lines)
