from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from kernel.vllm_cli import LaunchCommandError, flag_steps, flag_table, parse_launch_command

KIMI = (
    "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --trust-remote-code --load-format fastsafetensors "
    "--no-enable-flashinfer-autotune --max-model-len 1048576 --kv-cache-dtype fp8 --enable-prefix-caching "
    "--enable-auto-tool-choice --tool-call-parser kimi_k3 --speculative-config "
    '\'{"model": "RedHatAI/Kimi-K3-speculator.dspark", "num_speculative_tokens": 8}\''
)


def test_minimal_command_keeps_only_what_loads_the_model() -> None:
    command = parse_launch_command(shlex.split(KIMI))
    assert command.keep_steps({"essential"}).shell_line() == (
        "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --trust-remote-code --load-format fastsafetensors"
    )
    # prefix caching is on by default in vLLM V1: the minimal launch turns it off so its ladder step adds it back
    assert command.minimal().shell_line() == (
        "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --trust-remote-code --load-format fastsafetensors"
        " --no-enable-prefix-caching"
    )
    assert command.minimal().value("--enable-prefix-caching") is False
    assert shlex.split(command.shell_line()) == shlex.split(KIMI)


def test_steps_of_the_ladder_are_read_from_the_table() -> None:
    command = parse_launch_command(shlex.split(KIMI))
    steps = {option.spec.name: option.spec.step for option in command.options}
    assert steps["--enable-prefix-caching"] == "prefix_caching"
    assert steps["--max-model-len"] == "max_model_len"
    assert steps["--tool-call-parser"] == "tools_structured_output"
    assert steps["--speculative-config"] == "speculative_decoding"
    assert steps["--enable-flashinfer-autotune"] == "kernel_backends"
    assert all(spec.step in flag_steps() for spec in flag_table().flags.values())
    # every flag the minimal launch strips is restored by some ladder step: none is left for the target only
    requests_only = {"long_input", "as_written"}  # a step that changes the request, and the whole command
    assert {spec.step for spec in flag_table().flags.values()} == set(flag_steps()) - requests_only


def test_the_same_configuration_in_another_order_is_the_same_server() -> None:
    command = parse_launch_command(shlex.split(KIMI))
    shuffled = replace(command, options=tuple(reversed(command.options)))
    assert shuffled.argv() != command.argv() and shuffled.same_configuration(command)
    assert not command.minimal().same_configuration(command)
    added = ["--no-enable-flashinfer-autotune", "--max-model-len 1048576", "--kv-cache-dtype fp8"]
    assert command.added_to(command.minimal())[:3] == added


@pytest.mark.parametrize(
    ("args", "flag", "value"),
    [
        (["--tensor_parallel_size", "8"], "--tensor-parallel-size", "8"),
        (["-tp", "4"], "--tensor-parallel-size", "4"),
        (["--tensor-parallel-size=2"], "--tensor-parallel-size", "2"),
        (["--trust-remote"], "--trust-remote-code", True),
        (["--no-enable-prefix-caching"], "--enable-prefix-caching", False),
        (["--disable-prefix-caching"], "--enable-prefix-caching", False),
        (["--enable-prefix-caching", "--no-enable-prefix-caching"], "--enable-prefix-caching", False),
        (["-O3"], "--optimization-level", "3"),
        (["--max-model-len", "-1"], "--max-model-len", "-1"),
    ],
)
def test_vllm_spellings_are_accepted(args: list[str], flag: str, value: str | bool) -> None:
    command = parse_launch_command(["vllm", "serve", "some/model", *args])
    assert command.value(flag) == value
    assert command.model == "some/model"


def test_model_can_be_given_with_the_model_flag() -> None:
    command = parse_launch_command(["vllm", "serve", "--model", "a/b", "-tp", "8"])
    assert command.model == "a/b"
    assert command.keep_steps({"essential"}).argv() == ["vllm", "serve", "--model", "a/b", "-tp", "8"]


def test_dotted_json_subkeys_belong_to_their_flag() -> None:
    command = parse_launch_command(["vllm", "serve", "m", "-cc.cudagraph_mode=PIECEWISE"])
    (option,) = command.options
    assert (option.spec.name, option.subkey, option.value) == ("--compilation-config", "cudagraph_mode", "PIECEWISE")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("vllm serve m --tensor-parallel-size 8 --foo --bar=1", "unrecognized arguments: --foo --bar=1"),
        ("vllm serve m --dtype fp4", "argument --dtype: invalid choice: 'fp4'"),
        ("vllm serve m --port", "argument --port: expected one argument"),
        ("vllm serve m --trust-remote-code=yes", "ignored explicit argument"),
        ("vllm serve m --enable", "ambiguous option: --enable could match"),
        ("vllm serve", "no model given"),
        ("python train.py", "must start with `vllm serve`"),
        ("vllm serve a b", "unrecognized arguments: b"),
    ],
)
def test_bad_commands_get_one_clear_line(argv: str, message: str) -> None:
    with pytest.raises(LaunchCommandError) as caught:
        parse_launch_command(argv.split())
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_with_flag_replaces_earlier_occurrences() -> None:
    command = parse_launch_command(["vllm", "serve", "m", "--port", "8000", "--host", "0.0.0.0"])
    changed = command.with_flag("--port", "9001").with_flag("--enforce-eager")
    assert changed.argv() == ["vllm", "serve", "m", "--host", "0.0.0.0", "--port", "9001", "--enforce-eager"]
    assert changed.served_model_name == "m"
