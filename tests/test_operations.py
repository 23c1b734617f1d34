"""The one command registry (bot/operations.py): both front-ends are built from it and accept the same thing."""

from __future__ import annotations

import argparse
import importlib

import pytest

from bot import cli, rich
from bot.operations import BOTH, CLI, OPERATIONS, SLACK, Operation, RegistryError, check_handled, on
from bot.slack import commands as slack
from bot.slack.handlers import HANDLERS, handles

SHARED = [op for op in OPERATIONS if op.surfaces == BOTH]


def _sub(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _terminal(name: str) -> argparse.ArgumentParser:
    return _sub(cli.build_parser(name)).choices[name]


def _sample(op: Operation) -> tuple[str, list[str]]:
    """One command line using every argument and every option both surfaces share: Slack's text, the argv."""
    words, argv = [op.name], [op.name]
    for arg in op.args:
        if len(arg.choices) == 1:
            words.append(arg.choices[0])
            argv.append(f"--{arg.choices[0]}")
        else:
            words.append(f"x-{arg.name}")
            argv.append(f"x-{arg.name}")
    for option in op.options_on(SLACK):
        words += [f"--{option.name}", f"v-{option.name}"]
        argv += [f"--{option.name}", f"v-{option.name}"]
    return " ".join(words), argv


def test_the_shared_operations_are_the_ones_both_front_ends_had() -> None:
    assert [op.name for op in SHARED] == ["start", "runs", "cancel", "rerun", "minimize", "runners", "note"]
    # what only the terminal takes: how it prints, how many rows, a log file on this machine
    only_terminal = {op.name: {o.name for o in op.options if o.surfaces == {CLI}} for op in SHARED}
    assert {name: names for name, names in only_terminal.items() if names} == {
        "start": {"logs", "log"},
        "runs": {"limit"},
        "rerun": {"logs"},
        "minimize": {"logs"},
    }


@pytest.mark.parametrize("op", SHARED, ids=[op.name for op in SHARED])
def test_a_shared_operation_takes_the_same_arguments_and_options_on_both_surfaces(op: Operation) -> None:
    text, argv = _sample(op)
    said = slack.parse(text).args
    parsed = vars(cli.build_parser(op.name).parse_args(argv))
    names = {arg.name for arg in op.args} | {option.dest for option in op.options_on(SLACK)}
    assert set(said) == names
    typed = {name: " ".join(v) if isinstance(v := parsed[name], list) else v for name in names}
    assert typed == said  # the same names, the same values, from either front-end
    # what the terminal takes beyond Slack is declared terminal-only in the registry, nothing else
    registry = {f"--{o.name}" for o in op.options} | {f"--{a.choices[0]}" for a in op.args if len(a.choices) == 1}
    flags = {s for a in _terminal(op.name)._actions for s in a.option_strings if s.startswith("--")} - {"--help"}
    assert flags == registry
    for option in op.options:
        if SLACK not in option.surfaces:
            with pytest.raises(slack.CommandError, match="unknown option"):
                slack.parse(f"{text} --{option.name} x")


def test_start_takes_profile_and_image_on_both_surfaces() -> None:
    said = slack.parse("start cluster-a --profile kimi-k3 --image vllm/vllm-openai:v2").args
    args = cli.build_parser("start").parse_args(
        ["start", "cluster-a", "--profile", "kimi-k3", "--image", "vllm/vllm-openai:v2"]
    )
    assert said == {"cluster": "cluster-a", "profile": "kimi-k3", "image": "vllm/vllm-openai:v2"}
    assert (args.cluster, args.profile, args.image) == ("cluster-a", "kimi-k3", "vllm/vllm-openai:v2")
    assert (cli.build_parser("start").parse_args(["start", "c"]).profile, args.func.__name__) == ("", "run_start")


def test_help_on_both_surfaces_comes_from_the_registry() -> None:
    listed = {a.dest: a.help for a in _sub(cli.build_parser())._choices_actions}
    assert listed == {op.name: op.help(CLI) for op in on(CLI).values()}
    lines = rich.mrkdwn(slack.help_text("/k3repro")).splitlines()
    assert lines == [f"`/k3repro {op.usage()}` — {op.help(SLACK)}" for op in on(SLACK).values()]
    for op in SHARED:  # one summary, each surface adding only what it answers with
        assert str(listed[op.name]).startswith(op.summary)
        assert any(line.endswith(f"— {op.summary}") or f"— {op.summary}; " in line for line in lines)
    for op in on(CLI).values():
        for leaf in op.actions or (op,):
            parser = _terminal(op.name)
            if op.actions:
                parser = _sub(parser).choices[leaf.name]
            words = {f"--{a.choices[0]}": a.help for a in leaf.args if len(a.choices) == 1}  # rerun's --isolated
            helps = {s: a.help for a in parser._actions for s in a.option_strings if s.startswith("--")}
            assert helps == {"--help": "show this help message and exit", **words} | {
                f"--{o.name}": o.help for o in leaf.options if CLI in o.surfaces
            }, leaf.name


def test_slacks_usage_lines_are_the_ones_users_know() -> None:
    assert {name: op.usage() for name, op in on(SLACK).items()} == {
        "start": "start CLUSTER [--profile P] [--image REF]",
        "status": "status [RUN]",
        "runs": "runs",
        "cancel": "cancel RUN",
        "rerun": "rerun RUN isolated",
        "minimize": "minimize RUN",
        "runners": "runners [CLUSTER]",
        "baseline": "baseline [PROFILE]",
        "note": "note CLUSTER TEXT",
        "help": "help",
    }


def test_every_slack_operation_has_exactly_one_handler() -> None:
    check_handled(SLACK, HANDLERS)  # what the handlers module's import ran
    with pytest.raises(RegistryError, match=r"no handler for \['note'\]"):
        check_handled(SLACK, set(HANDLERS) - {"note"})
    with pytest.raises(RegistryError, match=r"a handler for no slack operation: \['show'\]"):
        check_handled(SLACK, {*HANDLERS, "show"})
    with pytest.raises(RegistryError, match="two Slack handlers for `start`"):
        handles("start")(HANDLERS["status"])
    assert HANDLERS["start"].__name__ == "_start"


def test_every_terminal_operation_has_its_handler() -> None:
    handled = {}
    for op in OPERATIONS:
        for leaf in op.actions or (op,):
            assert bool(leaf.cli) == (CLI in leaf.surfaces), leaf.name  # Slack-only ones have none
            if leaf.cli:
                module, _, function = leaf.cli.partition(":")
                handled[leaf.name] = getattr(importlib.import_module(module), function)
    assert all(callable(work) for work in handled.values())
    check_handled(CLI, {op.name for op in on(CLI).values() if not op.actions})
    with pytest.raises(RegistryError, match=r"no handler for \['diff'\]"):
        check_handled(CLI, {op.name for op in on(CLI).values() if not op.actions} - {"diff"})
