"""Every operation k3repro offers, declared once: the Slack command parser and the terminal's argparse parser
are both built from this table (bot/slack/commands.py, bot/cli.py), and each front-end registers its handlers
beside the operation's name (bot/slack/handlers.py's `@handles`, `Operation.cli` for the terminal).

Data only, and light on purpose: `k3repro --help` reads it without loading any command (no store, gRPC or
analyzer import here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Surface = Literal["slack", "cli"]
SLACK: Surface = "slack"
CLI: Surface = "cli"
BOTH: frozenset[Surface] = frozenset({SLACK, CLI})
ValueType = Literal["str", "int", "path", "positive"]  # bot/cli.py maps each to argparse's type


class RegistryError(RuntimeError):
    """A front-end out of step with the registry (a handler without an operation, or one missing)."""


@dataclass(frozen=True)
class Arg:
    """A positional argument. `rest`: the free text to the end of the line (Slack) or every remaining word
    (terminal). One choice is a literal word in Slack (`rerun RUN isolated`) and a required flag on the terminal
    (`rerun RUN --isolated`); both give the same name the same value."""

    name: str
    metavar: str
    help: str = ""
    optional: bool = False
    rest: bool = False
    choices: tuple[str, ...] = ()
    type: ValueType = "str"


@dataclass(frozen=True)
class Option:
    """`--name VALUE`, or a flag when `metavar` is empty (flags exist only on the terminal: Slack's are valued)."""

    name: str
    help: str
    metavar: str = ""
    short: str = ""  # e.g. "-o"
    type: ValueType = "str"
    default: str | int | None = None
    required: bool = False
    repeat: bool = False  # may be given again; the value is the list
    exclusive: str = ""  # options with the same group name exclude each other
    surfaces: frozenset[Surface] = BOTH

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class Operation:
    """One operation: what it is called, takes, who may run it, where it is offered and what it answers.

    `summary` is the one line both surfaces show; `answers[surface]` says what that surface answers with, added
    after it. `operates`: it changes something, so only the cluster's operators may run it and (in Slack) only
    in the cluster's channels. `immediate`: answered in Slack's ack itself (pure: no store, no runner).
    `cli`: the terminal's handler, "package.module:function", imported only when it runs: the bot's commands
    (bot/commands), the GPU host's tools (runner/tools: a host with only the runner installed runs them) and
    the demo that wires the products together (demo/).
    `actions`: sub-operations (`bundle export`, `bundle import`), each with its own arguments and handler."""

    name: str
    summary: str
    args: tuple[Arg, ...] = ()
    options: tuple[Option, ...] = ()
    operates: bool = False
    surfaces: frozenset[Surface] = BOTH
    answers: Mapping[Surface, str] = field(default_factory=dict)
    description: str = ""
    immediate: bool = False
    cli: str = ""
    actions: tuple[Operation, ...] = ()

    def help(self, surface: Surface) -> str:
        answer = self.answers.get(surface)
        return f"{self.summary}; {answer}" if answer else self.summary

    def options_on(self, surface: Surface) -> tuple[Option, ...]:
        return tuple(option for option in self.options if surface in option.surfaces)

    def usage(self) -> str:
        """Slack's usage line: `start CLUSTER [--profile P] [--image REF]`."""
        words = [self.name]
        for arg in self.args:
            if len(arg.choices) == 1:
                words.append(arg.choices[0])
            else:
                words.append(f"[{arg.metavar}]" if arg.optional else arg.metavar)
        words += [f"[--{option.name} {option.metavar}]" for option in self.options_on(SLACK)]
        return " ".join(words)


_CLI_ONLY: frozenset[Surface] = frozenset({CLI})


def _cli_option(name: str, help: str, metavar: str = "", **facts: Any) -> Option:
    """An option only the terminal has: how it prints, a file it reads or writes, a host-only setting."""
    return Option(name, help, metavar, surfaces=_CLI_ONLY, **facts)


_LOGS = _cli_option("logs", "also print the engine's log as it arrives")
_RUN = Arg("run", "RUN")
_CLUSTER = Arg("cluster", "CLUSTER")
_TARGET = (  # what a fingerprint probes: one or the other
    _cli_option("image", "probe this local image in a short-lived container", "REF", exclusive="target"),
    _cli_option("python", "probe this Python's install (bare metal)", "PATH", exclusive="target"),
)


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "start",
        "start a run on a cluster",
        args=(_CLUSTER,),
        options=(
            Option(
                "profile", "the compatibility baseline profile for this run (default: the cluster's)", "P", default=""
            ),
            Option(
                "image",
                "the image for this run (default: the cluster's; the runner's allowlist decides)",
                "REF",
                default="",
            ),
            _LOGS,
            Option(
                "log",
                "the failing deployment's own log: its first error is recorded by freeze and compared in the verdict",
                "FILE",
                surfaces=_CLI_ONLY,
            ),
        ),
        operates=True,
        answers={SLACK: "its thread tells the story", CLI: "followed live here (Ctrl-C detaches)"},
        cli="bot.commands.start:run_start",
    ),
    Operation(
        "watch",
        "follow a run again, from where this store stopped",
        args=(_RUN,),
        options=(_LOGS,),
        surfaces=_CLI_ONLY,
        cli="bot.commands.start:run_watch",
    ),
    Operation(
        "status",
        "the active runs of this channel's clusters (to their operators), or one",
        args=(Arg("run", "RUN", optional=True),),
        surfaces=frozenset({SLACK}),
    ),
    Operation(
        "runs",
        "the latest runs",
        options=(_cli_option("limit", "how many (default: 20)", "N", type="int", default=20),),
        answers={
            SLACK: "those of this channel's clusters, to their operators",
            CLI: "those of every cluster in this store",
        },
        cli="bot.commands.runs:list_runs",
    ),
    Operation(
        "show",
        "show a run and everything it recorded",
        args=(_RUN,),
        options=(
            _cli_option("logs", "include the engine's log"),
            _cli_option("json", "the run, its report and its events as JSON"),
            _cli_option("timeline", "also draw the run's launches as a PNG", "FILE", type="path"),
        ),
        surfaces=_CLI_ONLY,
        cli="bot.commands.runs:show_run",
    ),
    Operation("cancel", "cancel an active run", args=(_RUN,), operates=True, cli="bot.commands.runs:cancel_run"),
    Operation(
        "rerun",
        "rerun a run's frozen case on an isolated node",
        args=(_RUN, Arg("where", "WHERE", "on a runner from the cluster's isolation provider", choices=("isolated",))),
        options=(_LOGS,),
        operates=True,
        answers={SLACK: "the answer shows what it launches", CLI: "prints the verdict"},
        cli="bot.commands.rerun:run",
    ),
    Operation(
        "minimize",
        "shrink a finished run's flags to a 1-minimal set that fails the same way (a run of its own)",
        args=(Arg("run", "RUN", "a finished run whose ladder named a trigger step"),),
        options=(_LOGS,),
        operates=True,
        cli="bot.commands.minimize:run",
    ),
    Operation(
        "runners",
        "every runner: reachable, idle or busy",
        args=(Arg("cluster", "CLUSTER", optional=True),),
        answers={SLACK: "addresses to the cluster's operators", CLI: "with its address"},
        cli="bot.commands.runs:list_runners",
    ),
    Operation(
        "baseline",
        "the compatibility baseline a run checks against",
        args=(Arg("profile", "PROFILE", optional=True),),
        surfaces=frozenset({SLACK}),
    ),
    Operation(
        "note",
        "add to a cluster's change log (time + what changed)",
        args=(_CLUSTER, Arg("text", "TEXT", "what changed, e.g. 'driver 580.82 -> 580.95 on gpu-a1'", rest=True)),
        operates=True,
        cli="bot.commands.note:run",
    ),
    Operation("help", "this list", surfaces=frozenset({SLACK}), immediate=True),
    Operation(
        "report",
        "write a run's hand-off report: one Markdown document to act on",
        args=(_RUN,),
        options=(_cli_option("output", "write it to FILE instead of stdout", "FILE", short="-o", type="path"),),
        surfaces=_CLI_ONLY,
        cli="bot.commands.report:write_report",
    ),
    Operation(
        "bundle",
        "export or import a run's frozen bundle (tar.gz with a sha256 manifest)",
        surfaces=_CLI_ONLY,
        actions=(
            Operation(
                "export",
                "write a finished run's bundle",
                args=(_RUN,),
                options=(
                    _cli_option("output", "the bundle file to write", "OUTPUT", short="-o", type="path", required=True),
                ),
                surfaces=_CLI_ONLY,
                cli="bot.commands.bundle:run_export",
            ),
            Operation(
                "import",
                "verify a bundle and add its run to this store",
                args=(Arg("file", "FILE", type="path"),),
                surfaces=_CLI_ONLY,
                cli="bot.commands.bundle:run_import",
            ),
        ),
    ),
    Operation(
        "demo",
        "run the embedded demo end to end on this machine",
        options=(
            _cli_option(
                "scenario",
                "a built-in scenario name or a scenario file: the deployment, the simulated host, the faults "
                "(default: demo)",
                "SCENARIO",
                default="demo",
            ),
            _cli_option(
                "launch",
                "run the method on a real vLLM on this machine instead of the simulator: the launch command as the "
                "cluster runs it (e.g. the vLLM CPU build: 'PYTHON -m vllm.entrypoints.openai.api_server --model "
                "DIR ...'); the scenario's simulated host is not used",
                "COMMAND",
            ),
            _cli_option("speed", "sim speed factor (default from the demo config)", "SPEED", type="positive"),
            _cli_option("logs", "also print the engine's log"),
            _cli_option("json", "print only the run report as JSON"),
            _cli_option(
                "minimize",
                "then, when the ladder named a trigger, shrink the flags to a 1-minimal failing set (k3repro minimize)",
            ),
        ),
        surfaces=_CLI_ONLY,
        cli="demo.run:run",
    ),
    Operation(
        "dev-certs",
        "write a local CA plus runner and bot certificates (not for production)",
        args=(Arg("dir", "DIR", type="path"),),
        options=(
            _cli_option("host", "a name or IP the runner certificate is valid for (repeatable)", "HOST", repeat=True),
        ),
        surfaces=_CLI_ONLY,
        cli="bot.commands.dev_certs:run",
    ),
    Operation(
        "analyze",
        "find the first error of a vLLM log: phase, category, root-cause line, secondary OOM",
        args=(Arg("path", "PATH|-", "the log file, or - to read standard input"),),
        options=(
            _cli_option("json", "print the analysis as JSON (stable contract)"),
            _cli_option(
                "explain",
                "also say why: the rule that chose the line, what placed the phase, what decided the category, "
                "the wrappers passed over and a deliberate stop",
            ),
        ),
        surfaces=_CLI_ONLY,
        description="Analyze a vLLM log (a file, or - for standard input). Exit 0 when the analysis ran, "
        "whether or not it found a failure; 2 when the input cannot be read.",
        cli="bot.commands.analyze:run",
    ),
    Operation(
        "fingerprint",
        "record this host's scene: OS, NVML, image, versions that load, env (secrets redacted), sha256",
        options=(*_TARGET, _cli_option("json", "print the fingerprint JSON (stable contract)")),
        surfaces=_CLI_ONLY,
        description="Take an environment fingerprint. Without --image or --python, the Python on PATH is probed.",
        cli="runner.tools.fingerprint:run",
    ),
    Operation(
        "check",
        "check a fingerprint against a model's compatibility baseline (e.g. kimi-k3)",
        options=(
            _cli_option("baseline", "baseline profile, e.g. kimi-k3", "PROFILE", required=True),
            _cli_option("fingerprint", "a saved fingerprint (default: take one now)", "FILE"),
            _cli_option(
                "profiles-dir",
                "also look for PROFILE.toml here (before the shipped profiles); repeatable",
                "DIR",
                type="path",
                repeat=True,
            ),
            *_TARGET,
            _cli_option("json", "print the report as JSON (stable contract)"),
        ),
        surfaces=_CLI_ONLY,
        description="Exit 0 when the verdict is pass or warn, 1 when it is fail, 2 on bad input.",
        cli="runner.tools.check:run",
    ),
    Operation(
        "diff",
        "field-level differences between two fingerprints (driver, CUDA, digest, versions, GPUs, env)",
        args=(Arg("a", "A", "fingerprint file"), Arg("b", "B", "fingerprint file")),
        options=(_cli_option("json", "print the differences as JSON"),),
        surfaces=_CLI_ONLY,
        description="Exit 0 when both are the same scene (equal sha256), 1 when they differ, 2 on bad input.",
        cli="bot.commands.diff:run",
    ),
)

BY_NAME: dict[str, Operation] = {operation.name: operation for operation in OPERATIONS}


def on(surface: Surface) -> dict[str, Operation]:
    """The operations `surface` offers, in the registry's order (the order its help lists them)."""
    return {operation.name: operation for operation in OPERATIONS if surface in operation.surfaces}


def check_handled(surface: Surface, handled: Iterable[str]) -> None:
    """Raises unless `handled` names exactly the operations `surface` offers: a front-end's import calls it, so
    an operation without a handler, or a handler without an operation, never gets as far as a user."""
    names, offered = set(handled), {name for name, op in on(surface).items() if not op.actions}
    if names != offered:
        missing, extra = sorted(offered - names), sorted(names - offered)
        raise RegistryError(
            f"{surface} handlers out of step with bot/operations.py: no handler for {missing or 'none'}; "
            f"a handler for no {surface} operation: {extra or 'none'}"
        )
