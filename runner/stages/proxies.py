"""Proxy launches: a failure's repeats on the cheapest configuration that still exercises what it depends on.

GPU time is what an incident spends. Once a failure was met on the real configuration, the launches that only
show whether it repeats run with vLLM's own cost-cutting switches (runner/data/proxies.toml) where they cannot
change that failure. A proxy launch is evidence only when it fails in the same phase with the same signature;
otherwise it is reported, abandoned and the real launch made: a proxy is never trusted on its word.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import cache

from kernel.toml_reader import packaged
from kernel.vllm_cli import ServeCommand, flag_table
from protos.vocab import PHASES
from runner.stages.context import Attempt, RunContext


@dataclass(frozen=True)
class Proxy:
    id: str
    flag: str
    value: str | bool
    removes: str
    never_phases: frozenset[str]
    never_categories: frozenset[str]
    never_during: frozenset[str]
    useful_from: str
    ladder: bool
    replaces: bool

    def fits(self, command: ServeCommand) -> bool:
        """Whether the proxy can be added to `command` without dropping a value the deployment chose."""
        return self.replaces or not command.has(self.flag)

    def preserves(self, failure: Attempt) -> bool:
        """Whether this proxy can show `failure` again, and more cheaply."""
        return (
            failure.phase in PHASES
            and PHASES.index(failure.phase) >= PHASES.index(self.useful_from)
            and failure.phase not in self.never_phases
            and failure.category not in self.never_categories
            and failure.during not in self.never_during
        )


@cache
def proxies() -> tuple[Proxy, ...]:
    table = flag_table().flags
    found = []
    for row in packaged("proxies.toml", "runner.data").rows("proxy"):
        proxy = Proxy(
            id=row.text("id"),
            flag=row.text("flag"),
            value=row.value("value", True),
            removes=row.text("removes"),
            never_phases=frozenset(row.texts("never_phases")),
            never_categories=frozenset(row.texts("never_categories")),
            never_during=frozenset(row.texts("never_during")),
            useful_from=row.text("useful_from"),
            ladder=row.flag("ladder", False),
            replaces=row.flag("replaces", False),
        )
        if proxy.flag not in table:
            raise row.fail(f"{proxy.flag} is not in vllm_flags.toml")
        if not isinstance(proxy.value, str | bool):
            raise row.fail(f"'value' must be a string or true, got {proxy.value!r}")
        if proxy.useful_from not in PHASES:
            raise row.fail(f"unknown useful_from {proxy.useful_from!r}")
        found.append(proxy)
    return tuple(found)


def planned(ctx: RunContext, command: ServeCommand) -> tuple[ServeCommand, tuple[Proxy, ...]]:
    """What a launch of `command` runs now: with the proxies that preserve the failure being repeated, or the
    ladder's proxies once a real launch answered; never dropping a value the deployment chose (unless the
    proxy replaces it)."""
    target = ctx.plan.proxy_for
    if not ctx.config.engine.proxies:
        chosen: tuple[Proxy, ...] = ()
    elif target is not None:
        chosen = tuple(p for p in proxies() if p.preserves(target) and p.fits(command))
    elif ctx.plan.ladder_proxies:
        chosen = tuple(p for p in proxies() if p.ladder and p.fits(command))
    else:
        chosen = ()
    for proxy in chosen:
        command = command.with_flag(proxy.flag, proxy.value)
    return command, chosen


async def repeat(ctx: RunContext, target: Attempt, attempt: Callable[[], Awaitable[Attempt]]) -> Attempt:
    """One repeat of `target` (`attempt` launches and probes, and says how it failed, if it did): on a proxy
    where one applies, confirmed by its phase and signature; else, or when the proxy does not reproduce it,
    on the real configuration."""
    if target.failed and not target.foreign and any(p.preserves(target) for p in proxies()):
        ctx.plan.proxy_for = target
        try:
            got = await attempt()
        finally:
            ctx.plan.proxy_for = None
        if got.same_as(target):
            return got
        seen = f"failed in {got.phase} ({got.category})" if got.failed else "did not fail"
        await ctx.artifact(
            "proxy_abandoned",
            f"the proxy launch {seen} where the real one failed in {target.phase} ({target.category}): "
            "not the same failure, so it is not evidence; launching the real configuration",
        )
    with real_only(ctx):
        return await attempt()


def answered(ctx: RunContext) -> None:
    """The fixed request answered: once on the real configuration (the real weights were read), ladder
    relaunches may use the ladder's proxies."""
    ctx.plan.ladder_proxies = not ctx.session.running_proxies


@contextlib.contextmanager
def real_only(ctx: RunContext) -> Iterator[None]:
    """Launches in this block run the real configuration (a confirmation, or a repeat no proxy may stand in for)."""
    before, ctx.plan.ladder_proxies = ctx.plan.ladder_proxies, False
    try:
        yield
    finally:
        ctx.plan.ladder_proxies = before
