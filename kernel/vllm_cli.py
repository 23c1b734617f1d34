"""`vllm serve` command lines: parsed against the flag table, rebuilt as argv lists.

One parser serves the runner (launch commands from the bot) and vllm-sim (its own command line),
so both accept and refuse exactly the same flags, the way vLLM's argparse parser does: underscores
for dashes, `--no-X`, `--enable-X`/`--disable-X` inverses, unique prefixes, `--flag=value`, JSON
values with dotted sub-keys (`-cc.mode=none`) and `-O3`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from functools import cache
from typing import Literal, cast, get_args

from kernel.toml_reader import packaged

FlagKind = Literal["bool", "value", "json", "list"]


class LaunchCommandError(ValueError):
    """A command line vLLM's parser would refuse; the message is one line."""

    def __init__(self, message: str, *, unrecognized: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.unrecognized = unrecognized


@dataclass(frozen=True)
class FlagSpec:
    name: str
    kind: FlagKind
    step: str
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    off_in_minimal: bool = False


@dataclass(frozen=True)
class FlagTable:
    flags: dict[str, FlagSpec]
    # every accepted spelling (canonical, alias, negation) -> (spec, value for bools)
    spellings: dict[str, tuple[FlagSpec, bool]]

    def resolve(self, option: str) -> tuple[FlagSpec, bool]:
        """Spec of an option spelling, allowing unique prefixes of long options like argparse."""
        if option.startswith("--"):
            option = "--" + option[2:].replace("_", "-")
        if option in self.spellings:
            return self.spellings[option]
        if option.startswith("--"):
            matches = sorted({s for s in self.spellings if s.startswith(option) and s.startswith("--")})
            if len(matches) == 1:
                return self.spellings[matches[0]]
            if len(matches) > 1:
                raise LaunchCommandError(
                    f"ambiguous option: {option} could match {', '.join(matches)}",
                )
        raise KeyError(option)


@cache
def ladder_step_ids() -> tuple[str, ...]:
    """The ladder's steps, in order: kernel/data/ladder.toml is their one definition."""
    return tuple(row.text("id") for row in packaged("ladder.toml").rows("step"))


def flag_steps() -> tuple[str, ...]:
    """What a flag's `step` may be: kept by the minimal launch, or restored by a ladder step."""
    return ("essential", *ladder_step_ids())


@cache
def flag_table() -> FlagTable:
    """The table shipped in kernel/data/vllm_flags.toml."""
    flags: dict[str, FlagSpec] = {}
    for row in packaged("vllm_flags.toml").rows("flag"):
        if (kind := row.text("kind")) not in get_args(FlagKind):
            raise row.fail(f"unknown kind {kind!r} (one of {', '.join(get_args(FlagKind))})")
        spec = FlagSpec(
            name=row.text("name"),
            kind=cast(FlagKind, kind),
            step=row.text("step"),
            aliases=tuple(row.texts("aliases")),
            choices=tuple(row.texts("choices")),
            off_in_minimal=row.flag("off_in_minimal", False),
        )
        if spec.step not in flag_steps():
            raise row.fail(f"unknown step {spec.step!r}")
        flags[spec.name] = spec
    spellings: dict[str, tuple[FlagSpec, bool]] = {}
    for spec in flags.values():
        for spelling in (spec.name, *spec.aliases):
            spellings[spelling] = (spec, True)
        if spec.kind == "bool":
            bare = spec.name.removeprefix("--")
            spellings[f"--no-{bare}"] = (spec, False)
            for this, other in (("enable-", "disable-"), ("disable-", "enable-")):
                if bare.startswith(this) and f"--{other}{bare.removeprefix(this)}" not in flags:
                    spellings[f"--{other}{bare.removeprefix(this)}"] = (spec, False)
    return FlagTable(flags=flags, spellings=spellings)


@dataclass(frozen=True)
class Option:
    """One occurrence of a flag on the command line, with the tokens it was written as."""

    spec: FlagSpec
    tokens: tuple[str, ...]
    value: str | bool
    subkey: str = ""  # for dotted JSON sub-keys, e.g. "mode" in `-cc.mode=none`


@dataclass(frozen=True)
class ServeCommand:
    program: tuple[str, ...]
    model: str
    model_tokens: tuple[str, ...]
    options: tuple[Option, ...]

    def value(self, name: str) -> str | bool | None:
        """The effective value of a flag (last occurrence wins), None when not given."""
        found: str | bool | None = None
        for option in self.options:
            if option.spec.name == name and not option.subkey:
                found = option.value
        return found

    def has(self, name: str) -> bool:
        return any(option.spec.name == name for option in self.options)

    @property
    def served_model_name(self) -> str:
        name = self.value("--served-model-name")
        return name if isinstance(name, str) else self.model

    def argv(self) -> list[str]:
        tokens = [*self.program, *self.model_tokens]
        for option in self.options:
            tokens.extend(option.tokens)
        return tokens

    def shell_line(self) -> str:
        """The command as one line that can be pasted into a shell."""
        return shlex.join(self.argv())

    def keep_steps(self, steps: set[str]) -> ServeCommand:
        """The command with only the flags of the given steps."""
        return replace(self, options=tuple(o for o in self.options if o.spec.step in steps))

    def with_step_from(self, other: ServeCommand, step: str) -> ServeCommand:
        """This command with its flags of `step` replaced by those `other` gives (a ladder step's change)."""
        kept = tuple(o for o in self.options if o.spec.step != step)
        return replace(self, options=kept + tuple(o for o in other.options if o.spec.step == step))

    def added_to(self, base: ServeCommand) -> list[str]:
        """The flags of this command that `base` does not give as they are here, as written (one entry a flag)."""
        have = {option.tokens for option in base.options}
        return [" ".join(o.tokens) for o in self.options if o.tokens not in have]

    def same_configuration(self, other: ServeCommand) -> bool:
        """Whether both launch the same server: the same model and options, in any order (vLLM's parser gives
        a flag's last occurrence, so order matters only when a flag repeats)."""
        if (self.program, self.model_tokens) != (other.program, other.model_tokens):
            return False
        names = [o.spec.name + o.subkey for o in self.options]
        if len(set(names)) != len(names):
            return self.argv() == other.argv()
        return sorted(o.tokens for o in self.options) == sorted(o.tokens for o in other.options)

    def minimal(self) -> ServeCommand:
        """What is needed to load the model, with default-on features that a ladder step adds turned off."""
        command = self.keep_steps({"essential"})
        for spec in flag_table().flags.values():
            if spec.off_in_minimal:
                command = command.with_flag(spec.name, False)
        return command

    def with_flag(self, name: str, value: str | bool = True) -> ServeCommand:
        """The command with `name` set to `value`, replacing earlier occurrences."""
        spec = flag_table().flags[name]
        if spec.kind == "bool":
            tokens: tuple[str, ...] = (name,) if value is True else (f"--no-{name.removeprefix('--')}",)
        else:
            tokens = (name, str(value))
        kept = tuple(o for o in self.options if o.spec.name != name)
        return replace(self, options=(*kept, Option(spec, tokens, value)))


SERVE_PROGRAMS = (("vllm", "serve"), ("python", "-m", "vllm.entrypoints.openai.api_server"))


def split_program(argv: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """Separates `vllm serve` (or an accepted equivalent) from the rest of the argv."""
    for program in SERVE_PROGRAMS:
        head = argv[: len(program)]
        if len(head) == len(program) and all(
            got.rsplit("/", 1)[-1].startswith(want) if i == 0 else got == want
            for i, (got, want) in enumerate(zip(head, program, strict=True))
        ):
            return tuple(head), argv[len(program) :]
    raise LaunchCommandError(
        f"the launch command must start with `vllm serve`, got: {shlex.join(argv[:3]) or '(empty)'}"
    )


def parse_serve_args(args: list[str], program: tuple[str, ...] = ("vllm", "serve")) -> ServeCommand:
    """Parses the arguments after `vllm serve`; LaunchCommandError names every unknown flag."""
    table = flag_table()
    options: list[Option] = []
    positionals: list[str] = []
    unknown: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("-") or len(token) == 1 or _is_number(token):
            positionals.append(token)
            continue
        name, eq, attached = token.partition("=")
        if name.startswith("-O") and name[2:].isdigit():
            name, eq, attached = "-O", "=", name[2:]
        base, dot, subkey = name.partition(".")
        try:
            spec, flag_value = table.resolve(base)
        except KeyError:
            unknown.append(token)
            continue
        if spec.kind == "bool":
            if eq or dot:
                raise LaunchCommandError(f"argument {spec.name}: ignored explicit argument {attached!r}")
            options.append(Option(spec, (token,), flag_value))
            continue
        if dot and spec.kind != "json":
            unknown.append(token)
            continue
        tokens: tuple[str, ...]
        if eq:
            value, tokens = attached, (token,)
        elif spec.kind == "list":  # argparse's nargs="+": every value up to the next option
            end = i
            while end < len(args) and (not args[end].startswith("-") or _is_number(args[end])):
                end += 1
            if end == i:
                raise LaunchCommandError(f"argument {spec.name}: expected at least one argument")
            value, tokens = " ".join(args[i:end]), (token, *args[i:end])
            i = end
        elif i < len(args):
            value, tokens = args[i], (token, args[i])
            i += 1
        else:
            raise LaunchCommandError(f"argument {spec.name}: expected one argument")
        if spec.choices and value not in spec.choices:
            choices = ", ".join(repr(c) for c in spec.choices)
            raise LaunchCommandError(f"argument {spec.name}: invalid choice: {value!r} (choose from {choices})")
        options.append(Option(spec, tokens, value, subkey))
    if unknown:
        raise LaunchCommandError(f"unrecognized arguments: {' '.join(unknown)}", unrecognized=tuple(unknown))
    return _with_model(program, positionals, options)


def _with_model(program: tuple[str, ...], positionals: list[str], options: list[Option]) -> ServeCommand:
    model_options = [o for o in options if o.spec.name == "--model"]
    if len(positionals) > 1 or (positionals and model_options):
        raise LaunchCommandError(f"unrecognized arguments: {' '.join(positionals[1:] or positionals)}")
    if positionals:
        return ServeCommand(program, positionals[0], (positionals[0],), tuple(options))
    if model_options:
        model = model_options[-1]
        rest = tuple(o for o in options if o.spec.name != "--model")
        return ServeCommand(program, str(model.value), model.tokens, rest)
    raise LaunchCommandError("no model given: `vllm serve MODEL [flags]`")


def parse_launch_command(argv: list[str]) -> ServeCommand:
    """Parses a full launch command (`vllm serve MODEL ...`) given as an argv list."""
    program, rest = split_program(argv)
    return parse_serve_args(rest, program)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
