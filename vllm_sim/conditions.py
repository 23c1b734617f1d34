"""The conditions of a fault ([fault.when]): on the launch (flags, host) and on a request (its shape, the load).

All given conditions must hold; a flag the launch does not give satisfies no value condition.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernel.vllm_cli import ServeCommand, flag_table

if TYPE_CHECKING:
    from vllm_sim.scenario import Host

REQUEST_CONDITIONS = ("prompt_tokens_min", "repeated_prefix", "tools", "concurrency_min")
_CONDITION = re.compile(r"\s*(>=|<=|!=|==|>|<)?\s*(.*?)\s*")
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    "==": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
}


@dataclass(frozen=True)
class RequestView:
    """What a request-phase condition can see of a request when the engine schedules it."""

    prompt_tokens: int
    repeated_prefix: bool  # its first KV block was the first block of an earlier request on this server
    tools: bool
    concurrency: int  # requests in the engine at that moment, this one included


@dataclass(frozen=True)
class When:
    """Conditions of a fault; all given ones must hold."""

    flags_present: tuple[str, ...] = ()
    flags_absent: tuple[str, ...] = ()
    flag_values: tuple[tuple[str, str], ...] = ()  # (flag, "[op]value"), op one of > >= < <= == != (default ==)
    prompt_tokens_min: int | None = None
    repeated_prefix: bool | None = None
    tools: bool | None = None
    concurrency_min: int | None = None
    driver_below: str | None = None
    foreign_memory: bool | None = None

    def launch_matches(self, command: ServeCommand, host: Host) -> bool:
        return (
            all(_present(command, flag) for flag in self.flags_present)
            and not any(_present(command, flag) for flag in self.flags_absent)
            and all(_value_holds(command, flag, condition) for flag, condition in self.flag_values)
            and (self.driver_below is None or _version(host.driver_version) < _version(self.driver_below))
            and (self.foreign_memory is None or (host.foreign_memory_mib > 0) == self.foreign_memory)
        )

    def request_matches(self, request: RequestView) -> bool:
        return (
            (self.prompt_tokens_min is None or request.prompt_tokens >= self.prompt_tokens_min)
            and (self.repeated_prefix is None or request.repeated_prefix == self.repeated_prefix)
            and (self.tools is None or request.tools == self.tools)
            and (self.concurrency_min is None or request.concurrency >= self.concurrency_min)
        )


def _present(command: ServeCommand, flag: str) -> bool:
    """The launch gives the flag (a --no-/--disable- spelling: gives it switched off)."""
    spec, wanted = flag_table().resolve(flag)
    given = command.value(spec.name)
    return given is not None if spec.kind != "bool" else given is wanted


def _value_holds(command: ServeCommand, flag: str, condition: str) -> bool:
    """The flag's value satisfies the condition; a flag the launch does not give satisfies none."""
    given = command.value(flag_table().resolve(flag)[0].name)
    if not isinstance(given, str):
        return False
    op, operand = split_condition(condition)
    left, right = number(given), number(operand)
    if left is not None and right is not None:
        return _COMPARE[op](left, right)
    return _COMPARE[op](given, operand) if op in ("==", "!=") else False


def split_condition(condition: str) -> tuple[str, str]:
    match = _CONDITION.fullmatch(condition)
    assert match is not None  # every string matches: the operator is optional
    return match.group(1) or "==", match.group(2)


def number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
