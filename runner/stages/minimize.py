"""minimize: the deployment's optional flags shrunk to a 1-minimal set that still fails the same way.

Zeller's ddmin over the flags beyond the essentials (kernel/data/vllm_flags.toml), each test the minimal launch
with a subset of them added back, then the trigger step's probe. A test *fails* when it meets the failure being
reproduced (same phase, same signature), *passes* when it launches and answers, and is *unresolved* otherwise:
vLLM refused the flag set at argument validation, the server refused the probe, or a different failure came.
A flaky failure (seen in p of the full set's tries) makes a pass count only after enough tries for
1-(1-p)^n to reach the configured confidence. Tests run on a proxy where one preserves the failure
(stages/proxies.py: a proxy's pass is never trusted, its failure only by signature), and the minimal set is
confirmed once on the real configuration.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache

from kernel.toml_reader import packaged
from kernel.vllm_cli import Option, ServeCommand, flag_table
from protos import runner_pb2 as pb
from protos.vocab import PHASES, LadderOutcome, to_id
from runner.stages import ladder, proxies
from runner.stages.context import Attempt, RunContext, StageResult
from runner.stages.launcher import launch, release, shell_line


class Trial(StrEnum):
    """How one tested flag set came out: it fails the same way, passes (launches and answers), or is unresolved."""

    FAIL = "fail"
    PASS = "pass"  # noqa: S105 (a verdict, not a password)
    UNRESOLVED = "unresolved"


START_PHASES = PHASES[: PHASES.index("api_listen")]  # a failure here needs no probe: the launch decides


@dataclass(frozen=True)
class Limits:
    confidence: float  # a pass of a flaky failure needs 1-(1-p)^n at least this
    max_tries: int  # launches one subset may take to reach it
    max_tests: int  # distinct subsets tested before the search stops where it is


@cache
def limits() -> Limits:
    data = packaged("minimize.toml", "runner.data")
    return Limits(data.number("confidence"), data.whole("max_tries"), data.whole("max_tests"))


@dataclass(frozen=True)
class Unit:
    """One flag of the deployment, with every occurrence of it (`-cc.mode=x -cc.level=3` is one unit)."""

    name: str
    options: tuple[Option, ...]

    @property
    def text(self) -> str:
        return " ".join(token for option in self.options for token in option.tokens)


@dataclass(frozen=True)
class Tested:
    verdict: Trial
    why: str
    tries: int
    real: bool  # the verdict rests on a launch of the real configuration


def units_of(command: ServeCommand) -> tuple[Unit, ...]:
    """The deployment's optional flags in its order, then the features vLLM turns on by default that the
    deployment leaves on (prefix caching): the minimal launch turns those off, so they are flags here too."""
    full = command
    for spec in flag_table().flags.values():
        if spec.off_in_minimal and not command.has(spec.name):
            full = full.with_flag(spec.name, True)
    names = list(dict.fromkeys(o.spec.name for o in full.options if o.spec.step != "essential"))
    return tuple(Unit(name, tuple(o for o in full.options if o.spec.name == name)) for name in names)


def with_units(command: ServeCommand, units: tuple[Unit, ...]) -> ServeCommand:
    """The minimal launch of `command` (essentials, default-on features off) with `units` added back."""
    minimal, names = command.minimal(), {u.name for u in units}
    kept = tuple(o for o in minimal.options if o.spec.name not in names)
    return replace(minimal, options=kept + tuple(o for u in units for o in u.options))


def tries_needed(p: float, confidence: float, most: int) -> int:
    """Passing tries after which a flaky failure's absence holds with `confidence`: 1-(1-p)^n >= confidence."""
    if p >= 1.0:
        return 1
    if p <= 0.0:
        return most
    return max(1, min(most, math.ceil(math.log(1.0 - confidence) / math.log(1.0 - p))))


def confidence_of(p: float, tries: int) -> float:
    return 1.0 - (1.0 - min(max(p, 0.0), 1.0)) ** tries


Test = Callable[[tuple[Unit, ...]], Awaitable[Trial]]


async def ddmin(units: tuple[Unit, ...], test: Test) -> tuple[Unit, ...]:
    """Zeller's ddmin with unresolved outcomes: a subset or a complement that fails replaces the set; the
    granularity doubles until every single unit has been taken away. The result is 1-minimal: taking any one
    unit away passes or is unresolved. `test(units)` must fail."""
    current, n = units, 2
    while len(current) >= 2:
        chunks = _split(current, n)
        reduced = False
        for chunk in chunks:
            if await test(chunk) == Trial.FAIL:
                current, n, reduced = chunk, 2, True
                break
        if not reduced and len(chunks) > 2:  # with two chunks each complement is the other chunk, tested above
            for chunk in chunks:
                rest = tuple(u for u in current if u not in chunk)
                if await test(rest) == Trial.FAIL:
                    current, n, reduced = rest, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    if len(current) == 1 and await test(()) == Trial.FAIL:
        return ()
    return current


def _split(units: tuple[Unit, ...], n: int) -> list[tuple[Unit, ...]]:
    size, extra = divmod(len(units), n)
    chunks, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        chunks.append(units[start:end])
        start = end
    return [c for c in chunks if c]


class Tester:
    """Runs and remembers the tests of one minimize run (a subset is never launched twice)."""

    def __init__(self, ctx: RunContext, target: Attempt, step: str, units: tuple[Unit, ...]) -> None:
        self.ctx, self.target, self.step, self.units = ctx, target, step, units
        self.results: dict[frozenset[str], Tested] = {}
        self.order: list[tuple[tuple[Unit, ...], Tested]] = []
        self.p = 1.0  # how often the full set failed the same way
        self.exhausted = False

    async def test(self, subset: tuple[Unit, ...]) -> Trial:
        key = frozenset(u.name for u in subset)
        if key in self.results:
            return self.results[key].verdict
        if len(self.results) >= limits().max_tests:
            self.exhausted = True
            return Trial.UNRESOLVED
        tested = await self._tested(subset, tries_needed(self.p, limits().confidence, limits().max_tries))
        self.results[key] = tested
        self.order.append((subset, tested))
        await self.note(subset, tested)
        return tested.verdict

    async def measure(self) -> Tested:
        """The full set, tried engine.failure_attempts times: it must fail, and how often sets p."""
        tries = max(1, self.ctx.config.engine.failure_attempts)
        seen = [await self._once(self.units, f"minimize/full-{n}") for n in range(1, tries + 1)]
        fails = [t for t in seen if t.verdict == Trial.FAIL]
        self.p = len(fails) / len(seen)
        tested = fails[0] if fails else next((t for t in seen if t.verdict == Trial.UNRESOLVED), seen[0])
        tested = replace(tested, tries=len(seen), why=f"{len(fails)} of {len(seen)} tries failed the same way")
        self.results[frozenset(u.name for u in self.units)] = tested
        self.order.append((self.units, tested))
        await self.note(self.units, tested)
        return tested

    async def confirm(self, subset: tuple[Unit, ...]) -> Tested:
        """The minimal set once on the real configuration, unless a real launch showed its failure already."""
        kept = self.results.get(frozenset(u.name for u in subset))
        if kept is not None and kept.verdict == Trial.FAIL and kept.real:
            return kept
        with proxies.real_only(self.ctx):
            tested = self._verdict(await self._attempt(subset, "minimize/confirm"))
        self.order.append((subset, tested))
        await self.note(subset, tested, "confirmation on the real configuration")
        return tested

    async def _tested(self, subset: tuple[Unit, ...], tries: int) -> Tested:
        last = None
        source = f"minimize/test-{len(self.results) + 1}"
        for number in range(1, tries + 1):
            last = await self._once(subset, source if number == 1 else f"{source}/try-{number}")
            if last.verdict != Trial.PASS:
                return last
        assert last is not None
        if tries > 1:
            last = replace(
                last, tries=tries, why=f"{last.why}; {tries} tries, confidence {confidence_of(self.p, tries):.2f}"
            )
        return last

    async def _once(self, subset: tuple[Unit, ...], source: str) -> Tested:
        got = await proxies.repeat(self.ctx, self.target, lambda: self._attempt(subset, source))
        return self._verdict(got)

    async def _attempt(self, subset: tuple[Unit, ...], source: str) -> Attempt:
        ctx = self.ctx
        started = await launch(ctx, with_units(ctx.command, subset), source)
        if not started.ready:
            return started.failure or Attempt.inconclusive(started.summary)
        if self.target.phase in START_PHASES:
            await release(ctx)
            return Attempt.did_not_fail(ctx.session.running_proxies)
        outcome = await ladder.probe(ctx, self.step)
        await release(ctx)
        if outcome.failure is not None:
            return outcome.failure
        if outcome.outcome == pb.LADDER_OUTCOME_PROBE_ERROR:
            return Attempt.inconclusive(outcome.detail, LadderOutcome.PROBE_ERROR, ctx.session.running_proxies)
        return Attempt.did_not_fail(ctx.session.running_proxies)

    def _verdict(self, got: Attempt) -> Tested:
        target, real = self.target, not got.proxy
        if got.failed and got.same_as(target):
            return Tested(Trial.FAIL, f"fails in {got.phase} ({got.category}) with the same first error", 1, real)
        if got.held:
            return Tested(Trial.PASS, "launched and answered the probe", 1, real)
        if got.category == LadderOutcome.PROBE_ERROR:
            return Tested(Trial.UNRESOLVED, f"nothing tested: {got.signature}", 1, real)
        if got.phase == "gpu_detect" and got.category == "model_config":
            return Tested(Trial.UNRESOLVED, "vLLM refused this flag set at argument validation", 1, real)
        return Tested(Trial.UNRESOLVED, f"a different failure: {got.phase or 'no phase'} ({got.category})", 1, real)

    async def note(self, subset: tuple[Unit, ...], tested: Tested, what: str = "") -> None:
        flags = " ".join(u.text for u in subset) or "(essentials only)"
        label = what or f"{len(subset)} of {len(self.units)} flags"
        await self.ctx.artifact("minimize_test", f"{tested.verdict}: {label}: {flags} — {tested.why}")


async def run(ctx: RunContext) -> StageResult:
    request = ctx.request.minimize
    step = request.step
    target = Attempt(to_id(pb.Phase, request.phase), to_id(pb.ErrorCategory, request.category), request.signature)
    units = units_of(ctx.command)
    if not units:
        return StageResult(
            pb.STAGE_STATUS_FAILED, "the deployment sets no flag beyond the essentials: nothing to minimize"
        )
    tester = Tester(ctx, target, step, units)
    full = await tester.measure()
    if full.verdict != Trial.FAIL:
        return StageResult(
            pb.STAGE_STATUS_FAILED,
            f"the deployment's own flag set did not fail the same way ({full.why}; {full.verdict}): nothing to minimize",
        )
    minimal = await ddmin(units, tester.test)
    confirmed = await tester.confirm(minimal)
    result = _result(ctx, tester, minimal, confirmed)
    await ctx.artifact("minimal_failing_command", result)
    flags = " ".join(u.text for u in minimal) or "none of the optional flags"
    if confirmed.verdict != Trial.FAIL:
        return StageResult(
            pb.STAGE_STATUS_FAILED,
            f"{flags} failed on proxies but not on the real configuration ({confirmed.why}): not a minimal failing set",
        )
    proven = "" if not tester.exhausted else f" (stopped after {limits().max_tests} tests: not proven 1-minimal)"
    return StageResult(
        pb.STAGE_STATUS_OK,
        f"{len(minimal)} of {len(units)} flags still fail in {target.phase} ({target.category}): {flags}{proven} — "
        f"{len(tester.order)} flag sets tested, {ctx.session.launches} launches, confidence {result['confidence']:.2f}",
    )


def _result(ctx: RunContext, tester: Tester, minimal: tuple[Unit, ...], confirmed: Tested) -> dict[str, object]:
    """The minimal failing command, what is shown irrelevant, and what the tests say (the report's and bundle's)."""
    names = {u.name for u in minimal}
    removals = [tester.results.get(frozenset(names - {u.name})) for u in minimal]
    passes = [t.tries for t in removals if t is not None and t.verdict == Trial.PASS]
    return {
        "original_run_id": ctx.request.minimize.original_run_id,
        "command": shell_line(with_units(ctx.command, minimal)),
        "flags": [u.text for u in minimal],
        "irrelevant": [u.text for u in tester.units if u.name not in names],
        "unresolved_removals": [
            u.text for u, t in zip(minimal, removals, strict=True) if t is not None and t.verdict == Trial.UNRESOLVED
        ],
        "failure": {
            "phase": tester.target.phase,
            "category": tester.target.category,
            "signature": tester.target.signature,
        },
        "confirmed_on_real": confirmed.verdict == Trial.FAIL,
        "one_minimal": not tester.exhausted,
        "repeat_rate": tester.p,
        "confidence": min((confidence_of(tester.p, n) for n in passes), default=1.0),
        "tests": [
            {"flags": [u.text for u in subset], "verdict": t.verdict, "why": t.why, "tries": t.tries, "real": t.real}
            for subset, t in tester.order
        ],
        "launches": ctx.session.launches,
    }
