"""ladder: the deployment's features added back ONE at a time on top of the last stable configuration.

Steps that only change the request reuse the running server; a step relaunches only when the deployment
has flags of that step, so no launch is spent twice. When a step fails, the next builds on the last stable
configuration again; the first failure is the one being reproduced (its step is the trigger), a later
failure with the same signature is `same_as_target`, any other is saved as a new candidate.
"""

from __future__ import annotations

import asyncio
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import aiohttp

from protos import runner_pb2 as pb
from protos.vocab import LADDER_STEPS, from_id
from runner.stages import requests
from runner.stages.context import Attempt, RunContext, StageResult, StepOutcome
from runner.stages.launcher import attempt_of, foreign_now, launch
from runner.stages.prometheus import counter_total
from runner.vllm_cli import ServeCommand

ERROR_WAIT_S = 3.0  # after a failed request, how long the engine's log gets to show why


@dataclass(frozen=True)
class StepSpec:
    id: str
    probe: str
    flags: str = ""
    needs_peers: bool = False
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LadderSpec:
    steps: tuple[StepSpec, ...]
    outcomes: dict[str, str]
    prefix_queries: tuple[str, ...]
    prefix_hits: tuple[str, ...]
    settle_s: float


PROBES = ("fixed", "repeated_prefix", "long_input", "concurrent", "tools")


@cache
def ladder_spec() -> LadderSpec:
    data = tomllib.loads(resources.files("runner.data").joinpath("ladder.toml").read_text(encoding="utf-8"))
    steps = []
    for row in data["step"]:
        row = dict(row)
        spec = StepSpec(
            id=row.pop("id"),
            probe=row.pop("probe"),
            flags=row.pop("flags", ""),
            needs_peers=row.pop("needs_peers", False),
            params=row,
        )
        if spec.probe not in PROBES:
            raise ValueError(f"ladder.toml: step {spec.id} has unknown probe {spec.probe!r}")
        steps.append(spec)
    if [s.id for s in steps] != LADDER_STEPS:
        raise ValueError(f"ladder.toml: steps must be {', '.join(LADDER_STEPS)} in this order")
    metrics = data["metrics"]
    return LadderSpec(
        steps=tuple(steps),
        outcomes=dict(data["outcomes"]),
        prefix_queries=tuple(metrics["prefix_queries"]),
        prefix_hits=tuple(metrics["prefix_hits"]),
        settle_s=float(metrics["settle_s"]),
    )


async def run(ctx: RunContext) -> StageResult:
    spec = ladder_spec()
    for step in spec.steps:
        outcome = _relate(ctx, await _step(ctx, spec, step))
        ctx.steps.append(outcome)
        await ctx.emit(ladder_step=_message(outcome))
    trigger = next((s for s in ctx.steps if s.failure is not None), None)
    if trigger is None:
        return StageResult(pb.STAGE_STATUS_OK, f"every step held ({ctx.launches} launches in all)")
    await _repeat(ctx, spec, trigger)
    return StageResult(
        pb.STAGE_STATUS_FAILED,
        f"{trigger.step} triggers the failure: {trigger.detail}",
    )


def _message(outcome: StepOutcome) -> pb.LadderStepResult:
    message = pb.LadderStepResult(
        step=from_id(pb.LadderStepId, outcome.step),
        outcome=outcome.outcome,
        detail=outcome.detail,
        relaunched=outcome.relaunched,
    )
    if outcome.failure is not None:
        message.signature = outcome.failure.signature
        message.category = from_id(pb.ErrorCategory, outcome.failure.category)
        if outcome.failure.phase:
            message.phase = from_id(pb.Phase, outcome.failure.phase)
    return message


def _relate(ctx: RunContext, outcome: StepOutcome) -> StepOutcome:
    """A failure with the signature of the first one reproduces it; others are candidates."""
    first = next((s.failure for s in ctx.steps if s.failure is not None), None)
    if outcome.failure is None or first is None or outcome.failure.signature != first.signature:
        return outcome
    return StepOutcome(
        outcome.step, pb.LADDER_OUTCOME_SAME_AS_TARGET, outcome.detail, outcome.relaunched, outcome.failure
    )


async def _step(ctx: RunContext, spec: LadderSpec, step: StepSpec) -> StepOutcome:
    stable = ctx.stable
    assert stable is not None, "the ladder starts from a configuration that answered"
    desired = stable.with_step_from(ctx.command, step.flags) if step.flags else stable
    if step.needs_peers:
        given = [o.tokens[0] for o in ctx.command.options if o.spec.step == step.flags]
        reason = (
            f"the deployment sets {' '.join(given)}, but this single-host runner has no peer runners"
            if given
            else "the deployment uses no inter-node settings"
        )
        return StepOutcome(step.id, pb.LADDER_OUTCOME_NOT_APPLICABLE, reason, relaunched=False)
    if step.flags and desired == stable and step.probe == "fixed":
        return StepOutcome(
            step.id, pb.LADDER_OUTCOME_NOT_APPLICABLE, f"the deployment sets no {step.id} flags", relaunched=False
        )
    relaunched = ctx.running is None or ctx.running.argv() != desired.argv()
    if relaunched:
        started = await launch(ctx, desired, f"ladder/{step.id}")
        if not started.ready:
            failure = started.failure or Attempt("", "other", started.summary)
            return _failed(spec, step.id, started.summary, failure, relaunched=True)
    outcome = await _probe(ctx, spec, step, relaunched)
    if outcome.failure is None:
        ctx.stable = desired
    return outcome


async def _probe(ctx: RunContext, spec: LadderSpec, step: StepSpec, relaunched: bool) -> StepOutcome:
    async with aiohttp.ClientSession() as http:
        if step.probe == "repeated_prefix":
            return await _repeated_prefix(ctx, spec, step, http, relaunched)
        bodies = await _bodies(ctx, step, http)
        results = await asyncio.gather(*(requests.send(http, ctx, body, n) for n, body in enumerate(bodies, 1)))
    for result in results:
        await ctx.emit(request_result=result)
    bad = next((r for r in results if r.http_status != 200), None)
    if bad is None:
        first = results[0]
        detail = f"{len(results)} request(s) answered; first: {first.prompt_tokens} prompt tokens, finish {first.finish_reason}"
        return StepOutcome(step.id, pb.LADDER_OUTCOME_OK, detail, relaunched)
    return await _request_failed(ctx, spec, step.id, bad, relaunched)


async def _bodies(ctx: RunContext, step: StepSpec, http: aiohttp.ClientSession) -> list[dict[str, Any]]:
    if step.probe == "long_input":
        limit = await _max_model_len(ctx, http)
        words = min(int(step.params["max_input_words"]), int(limit * float(step.params["input_fraction"])))
        return [requests.with_text(ctx, requests.filler(words))]
    if step.probe == "concurrent":
        return [requests.fixed_body(ctx) for _ in range(int(step.params["requests"]))]
    if step.probe == "tools":
        return [requests.with_tools(ctx), requests.with_json_schema(ctx)]
    return [requests.fixed_body(ctx)]


async def _repeated_prefix(
    ctx: RunContext, spec: LadderSpec, step: StepSpec, http: aiohttp.ClientSession, relaunched: bool
) -> StepOutcome:
    """The same long prefix twice; the second request's cache hit is the /metrics delta it caused."""
    prefix = requests.filler(int(step.params["prefix_words"]), seed="k3repro prefix probe.")
    first, second = (requests.with_text(ctx, f"{prefix} Question {n}: what is {n} plus {n}?") for n in (1, 2))
    warm = await requests.send(http, ctx, first, 1)
    await ctx.emit(request_result=warm)
    if warm.http_status != 200:
        return await _request_failed(ctx, spec, step.id, warm, relaunched)
    before = await _prefix_counters(ctx, spec, http)
    probe = await requests.send(http, ctx, second, 2)
    await ctx.emit(request_result=probe)
    if probe.http_status != 200:
        return await _request_failed(ctx, spec, step.id, probe, relaunched)
    await asyncio.sleep(spec.settle_s)
    after = await _prefix_counters(ctx, spec, http)
    if before is None or after is None:
        return StepOutcome(step.id, pb.LADDER_OUTCOME_CACHE_MISS, "no prefix-cache counters at /metrics", relaunched)
    queries, hits = after[0] - before[0], after[1] - before[1]
    detail = f"second request: {hits:,.0f} of {queries:,.0f} prompt tokens served from the prefix cache"
    outcome = pb.LADDER_OUTCOME_CACHE_HIT if hits > 0 else pb.LADDER_OUTCOME_CACHE_MISS
    return StepOutcome(step.id, outcome, detail, relaunched)


async def _prefix_counters(
    ctx: RunContext, spec: LadderSpec, http: aiohttp.ClientSession
) -> tuple[float, float] | None:
    text = await requests.get_text(http, f"{ctx.base_url}/metrics")
    if text is None:
        return None
    queries, hits = counter_total(text, spec.prefix_queries), counter_total(text, spec.prefix_hits)
    return None if queries is None or hits is None else (queries, hits)


async def _max_model_len(ctx: RunContext, http: aiohttp.ClientSession) -> int:
    models = await requests.get_json(http, f"{ctx.base_url}/v1/models")
    for model in (models or {}).get("data", []):
        if isinstance(model, dict) and isinstance(model.get("max_model_len"), int):
            return int(model["max_model_len"])
    return 8192


async def _request_failed(
    ctx: RunContext, spec: LadderSpec, step: str, result: pb.RequestResult, relaunched: bool
) -> StepOutcome:
    """A failed request is explained by the engine's first error when its log shows one."""
    follower = ctx.follower
    if follower is not None:
        await asyncio.wait([follower.first_error], timeout=ERROR_WAIT_S)
    error = follower.first_error.result() if follower is not None and follower.first_error.done() else None
    error = error or await requests.hang_of(ctx, result)
    summary = result.error or f"HTTP {result.http_status}"
    if error is None:
        failure = Attempt("request", "request_error", f"http {result.http_status}", foreign=foreign_now(ctx))
        return _failed(spec, step, summary, failure, relaunched)
    ctx.running = None  # an engine that logged a fatal error is not a server to reuse
    summary = f"failed in {error.phase} ({error.category}): {error.line}"
    return _failed(spec, step, summary, attempt_of(ctx, error), relaunched)


def _failed(spec: LadderSpec, step: str, summary: str, failure: Attempt, relaunched: bool) -> StepOutcome:
    outcome = from_id(pb.LadderOutcome, spec.outcomes.get(failure.category, "crash"))
    return StepOutcome(step, outcome, summary, relaunched, failure)


async def _repeat(ctx: RunContext, spec: LadderSpec, trigger: StepOutcome) -> None:
    """Attempts the trigger step again, on top of the configuration it failed on, to show it repeats."""
    assert trigger.failure is not None
    ctx.attempts.append(trigger.failure)
    step = next(s for s in spec.steps if s.id == trigger.step)
    base = ctx.stable
    for _ in range(ctx.config.engine.failure_attempts - 1):
        ctx.stable = _before(ctx, trigger)
        again = await _step(ctx, spec, step)
        ctx.attempts.append(again.failure or Attempt("", "", ""))
    ctx.stable = base


def _before(ctx: RunContext, trigger: StepOutcome) -> ServeCommand:
    """The stable configuration the trigger step was added to (the steps before it that held)."""
    command = ctx.command.minimal()
    for outcome in ctx.steps:
        if outcome is trigger:
            break
        flags = next(s.flags for s in ladder_spec().steps if s.id == outcome.step)
        if flags and outcome.failure is None and outcome.outcome != pb.LADDER_OUTCOME_NOT_APPLICABLE:
            command = command.with_step_from(ctx.command, flags)
    return command
