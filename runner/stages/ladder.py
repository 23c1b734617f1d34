"""ladder: the deployment's features added back ONE at a time on top of the last stable configuration.

Steps that only change the request reuse the running server; a step relaunches only when the deployment
has flags of that step, so no launch is spent twice. When a step fails, the next builds on the last stable
configuration again; the first failure is the one being reproduced (its step is the trigger), a later
failure with the same signature is `same_as_target`, any other is saved as a new candidate. After the
method's six steps every group of flags the minimal launch removed comes back, and the last rung launches
the deployment exactly as written: a run says "did not reproduce" only once that rung ran and held.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import aiohttp

from kernel.analyzer import default_rules
from kernel.analyzer.signature import signature
from kernel.toml_reader import packaged
from kernel.vllm_cli import ServeCommand
from protos import runner_pb2 as pb
from protos.vocab import CATEGORIES, LadderOutcome, from_id
from runner.stages import probes, proxies
from runner.stages.context import NOT_FAILED, Attempt, RunContext, StageResult, StepOutcome
from runner.stages.launcher import attempt_of, foreign_now, launch, not_reusable
from runner.stages.prometheus import counter_total

FALLBACK_MAX_MODEL_LEN = 2048  # when neither the server nor the launch says: a probe too short, never too long
PREFIX_SEED = "k3repro prefix probe."


@dataclass(frozen=True)
class StepSpec:
    id: str
    title: str
    probe: str
    flags: str = ""
    needs_peers: bool = False
    as_written: bool = False  # the last rung: the deployment's own command as given, real configuration
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LadderSpec:
    steps: tuple[StepSpec, ...]
    outcomes: dict[str, LadderOutcome]  # by error category: what a step that fails so found
    prefix_queries: tuple[str, ...]
    prefix_hits: tuple[str, ...]
    settle_s: float


PROBES = ("fixed", "repeated_prefix", "long_input", "concurrent", "tools")


@cache
def ladder_spec() -> LadderSpec:
    data = packaged("ladder.toml")
    steps = []
    for row in data.rows("step"):
        spec = StepSpec(
            id=row.text("id"),
            title=row.text("title"),
            probe=row.text("probe"),
            flags=row.text("flags", ""),
            needs_peers=row.flag("needs_peers", False),
            as_written=row.flag("as_written", False),
            params=row.unread(),
        )
        if spec.probe not in PROBES:
            raise row.fail(f"unknown probe {spec.probe!r} (one of {', '.join(PROBES)})")
        steps.append(spec)
    if len({s.id for s in steps}) != len(steps):
        raise data.fail("two steps have the same id")
    if not steps[-1].as_written or any(s.as_written for s in steps[:-1]):
        raise data.fail("the last step, and only it, is the deployment as written (as_written = true)")
    metrics = data.section("metrics")
    return LadderSpec(
        steps=tuple(steps),
        outcomes={
            category: LadderOutcome(outcome)
            for category, outcome in data.text_table("outcomes", CATEGORIES, list(LadderOutcome)).items()
        },
        prefix_queries=tuple(metrics.texts("prefix_queries")),
        prefix_hits=tuple(metrics.texts("prefix_hits")),
        settle_s=metrics.number("settle_s"),
    )


async def run(ctx: RunContext) -> StageResult:
    spec = ladder_spec()
    for step in spec.steps:
        outcome = _relate(ctx, await _step(ctx, spec, step))
        ctx.evidence.steps.append(outcome)
        await ctx.emit(ladder_step=_message(step, outcome))
    trigger = next((s for s in ctx.evidence.steps if s.failure is not None), None)
    if trigger is None:
        return StageResult(
            pb.STAGE_STATUS_OK,
            f"every step held, the deployment as written included ({ctx.session.launches} launches in all)",
        )
    await _repeat(ctx, spec, trigger)
    split = " (several flags: `minimize` can split them)" if len(trigger.added) > 1 else ""
    return StageResult(
        pb.STAGE_STATUS_FAILED,
        f"{trigger.step} triggers the failure{split}: {trigger.detail}",
    )


def _message(step: StepSpec, outcome: StepOutcome) -> pb.LadderStepResult:
    message = pb.LadderStepResult(
        step=outcome.step,
        outcome=outcome.outcome,
        detail=outcome.detail,
        relaunched=outcome.relaunched,
        title=step.title,
        added=outcome.added,
        as_written=step.as_written,
    )
    if outcome.failure is not None:
        message.signature = outcome.failure.signature
        message.category = from_id(pb.ErrorCategory, outcome.failure.category)
        if outcome.failure.phase:
            message.phase = from_id(pb.Phase, outcome.failure.phase)
    return message


def _relate(ctx: RunContext, outcome: StepOutcome) -> StepOutcome:
    """A failure with the signature of the first one reproduces it; others are candidates."""
    first = next((s.failure for s in ctx.evidence.steps if s.failure is not None), None)
    if outcome.failure is None or first is None or not outcome.failure.same_as(first):
        return outcome
    return replace(outcome, outcome=pb.LADDER_OUTCOME_SAME_AS_TARGET)


async def _step(ctx: RunContext, spec: LadderSpec, step: StepSpec, source: str = "") -> StepOutcome:
    stable = ctx.plan.stable
    assert stable is not None, "the ladder starts from a configuration that answered"
    if step.as_written:
        return await _as_written(ctx, spec, step, stable, source)
    desired = stable.with_step_from(ctx.command, step.flags) if step.flags else stable
    added = desired.added_to(stable)
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
            step.id, pb.LADDER_OUTCOME_NOT_APPLICABLE, f"the deployment sets no {step.title} flags", relaunched=False
        )
    if step.flags and desired.same_configuration(stable) and step.probe == "repeated_prefix":
        # The deployment turns the feature off itself, as the minimal launch does: a cache miss would say nothing.
        reason = f"the deployment turns {step.title} off, as the minimal launch does: nothing to add back"
        return StepOutcome(step.id, pb.LADDER_OUTCOME_NOT_APPLICABLE, reason, relaunched=False)
    if step.probe == "tools" and desired == stable and not _features(ctx, step):
        return StepOutcome(step.id, pb.LADDER_OUTCOME_NOT_APPLICABLE, _no_features(step), relaunched=False)
    outcome = await _tested(ctx, spec, step, desired, source or f"ladder/{step.id}")
    if outcome.failure is not None and outcome.failure.proxy and ctx.plan.proxy_for is None:
        outcome = await _confirmed(ctx, spec, step, desired, outcome)
    elif outcome.failure is None:
        ctx.plan.stable = desired
    return _naming(outcome, added)


def _naming(outcome: StepOutcome, added: list[str]) -> StepOutcome:
    """The outcome with every flag the step added named in it (a step may restore several)."""
    if not added:
        return outcome
    return replace(outcome, detail=f"adds {' '.join(added)}: {outcome.detail}", added=tuple(added))


async def _as_written(
    ctx: RunContext, spec: LadderSpec, step: StepSpec, stable: ServeCommand, source: str
) -> StepOutcome:
    """The last rung: the deployment's own command, on the real configuration. Not needed once a step before it
    reproduced the failure being looked for (the deployment as written carries that step's flags too)."""
    reproduced = next((s for s in ctx.evidence.steps if s.failure is not None), None)
    if reproduced is not None and not source and _is_the_deployments(ctx, reproduced.failure):
        return StepOutcome(
            step.id,
            pb.LADDER_OUTCOME_NOT_APPLICABLE,
            f"not launched: step {reproduced.step} already met the failure, and the deployment as written "
            "carries its flags",
            relaunched=False,
        )
    desired = stable if stable.same_configuration(ctx.command) else ctx.command
    added = desired.added_to(stable)
    with proxies.real_only(ctx):
        outcome = await _tested(ctx, spec, step, desired, source or f"ladder/{step.id}")
    if outcome.failure is None:
        ctx.plan.stable = desired
    outcome = replace(outcome, detail=f"the deployment's own command, as written: {outcome.detail}")
    return _naming(outcome, added)


def _is_the_deployments(ctx: RunContext, failure: Attempt | None) -> bool:
    """Whether `failure` is the one the deployment's own log shows (any failure, when no log was given)."""
    if failure is None or not ctx.request.HasField("deployment_error"):
        return failure is not None
    return failure.same_as(ctx.request.deployment_error)


async def _tested(ctx: RunContext, spec: LadderSpec, step: StepSpec, desired: ServeCommand, source: str) -> StepOutcome:
    """The step on a server running `desired` (or its proxy): relaunched only when the live one differs."""
    launched_as = proxies.planned(ctx, desired)[0]
    running = ctx.session.running
    relaunched = running is None or running.argv() != launched_as.argv() or not ctx.config.engine.reuse_server
    if relaunched:
        started = await launch(ctx, desired, source)
        if not started.ready:
            failure = started.failure or Attempt.inconclusive(started.summary)
            return _failed(spec, step.id, started.summary, failure, relaunched=True)
    return await _probe(ctx, spec, step, relaunched)


async def _confirmed(
    ctx: RunContext, spec: LadderSpec, step: StepSpec, desired: ServeCommand, on_proxy: StepOutcome
) -> StepOutcome:
    """A failure met on a proxy counts only once the real configuration shows it: the same step again, real."""
    assert on_proxy.failure is not None
    with proxies.real_only(ctx):
        real = await _tested(ctx, spec, step, desired, f"ladder/{step.id}/confirm")
    seen, wanted = real.failure, on_proxy.failure
    if seen is not None and seen.same_as(wanted):
        return replace(real, detail=f"{real.detail} (met on a proxy, confirmed on the real configuration)")
    what = f"fails in {seen.phase} ({seen.category})" if seen is not None and seen.failed else "holds"
    await ctx.artifact(
        "proxy_abandoned",
        f"ladder step {step.id} failed on a proxy in {wanted.phase} ({wanted.category}) but {what} on the real "
        "configuration: the proxy's failure is not evidence",
    )
    if real.failure is None:
        ctx.plan.stable = desired
    return real


async def _probe(ctx: RunContext, spec: LadderSpec, step: StepSpec, relaunched: bool) -> StepOutcome:
    async with aiohttp.ClientSession() as http:
        if step.probe == "repeated_prefix":
            return await _repeated_prefix(ctx, spec, step, http, relaunched)
        bodies = await _bodies(ctx, step, http)
        before = await probes.gpu_memory_in_use(ctx) if len(bodies) > 1 else None
        results = await asyncio.gather(*(probes.send(http, ctx, body, n, before) for n, body in enumerate(bodies, 1)))
    for result in results:
        await ctx.emit(request_result=result)
    failed = next((r for r in results if r.http_status != 200 and not probes.refused_as_invalid(r)), None)
    if failed is not None:
        return await _request_failed(ctx, spec, step.id, failed, relaunched)
    refused = next((r for r in results if r.http_status != 200), None)
    if refused is not None:
        return _refused(step.id, refused, relaunched)
    first = results[0]
    detail = (
        f"{len(results)} request(s) answered; first: {first.prompt_tokens} prompt tokens, finish {first.finish_reason}"
    )
    if step.probe == "tools":
        detail = f"{', '.join(_features(ctx, step)) or 'the fixed request'}: {detail}"
    return StepOutcome(step.id, pb.LADDER_OUTCOME_OK, detail, relaunched)


def _refused(step: str, result: pb.RequestResult, relaunched: bool) -> StepOutcome:
    """The server refused our probe as invalid: the probe is wrong, not the deployment (never a trigger)."""
    detail = f"the server refused the probe (HTTP {result.http_status}): {result.error or 'no message'}"
    return StepOutcome(step, pb.LADDER_OUTCOME_PROBE_ERROR, detail, relaunched)


def _features(ctx: RunContext, step: StepSpec) -> list[str]:
    """Which of tool calls and structured output the deployment has (its flags, its fixed request)."""
    command, body = ctx.command, probes.fixed_body(ctx)
    has: list[str] = []
    for name, flags, fields in (
        ("tool calls", "tool_flags", "tool_fields"),
        ("structured output", "structured_flags", "structured_fields"),
    ):
        if any(command.has(f) for f in step.params[flags]) or any(f in body for f in step.params[fields]):
            has.append(name)
    return has


def _no_features(step: StepSpec) -> str:
    flags = " / ".join([*step.params["tool_flags"], *step.params["structured_flags"]])
    return f"the deployment sets no {flags} and its fixed request asks for neither tool calls nor structured output"


async def _bodies(ctx: RunContext, step: StepSpec, http: aiohttp.ClientSession) -> list[dict[str, Any]]:
    if step.probe == "long_input":
        budget = await _token_budget(ctx, http, float(step.params["input_fraction"]))
        return [await probes.sized_body(http, ctx, min(int(step.params["max_input_tokens"]), budget))]
    if step.probe == "concurrent":
        return [probes.fixed_body(ctx) for _ in range(int(step.params["requests"]))]
    if step.probe == "tools":
        features = _features(ctx, step)
        bodies = [probes.with_tools(ctx)] if "tool calls" in features else []
        bodies += [probes.with_json_schema(ctx)] if "structured output" in features else []
        return bodies or [probes.fixed_body(ctx)]
    return [probes.fixed_body(ctx)]


async def _repeated_prefix(
    ctx: RunContext, spec: LadderSpec, step: StepSpec, http: aiohttp.ClientSession, relaunched: bool
) -> StepOutcome:
    """The same long prefix twice; the second request's cache hit is the /metrics delta it caused."""
    budget = await _token_budget(ctx, http, float(step.params["prefix_fraction"]))
    tokens = min(int(step.params["max_prefix_tokens"]), budget)
    first, second = [
        await probes.sized_body(http, ctx, tokens, seed=PREFIX_SEED, tail=f"Question {n}: what is {n} plus {n}?")
        for n in (1, 2)
    ]
    warm = await probes.send(http, ctx, first, 1)
    await ctx.emit(request_result=warm)
    if warm.http_status != 200:
        return await _not_answered(ctx, spec, step.id, warm, relaunched)
    before = await _prefix_counters(ctx, spec, http)
    probe = await probes.send(http, ctx, second, 2)
    await ctx.emit(request_result=probe)
    if probe.http_status != 200:
        return await _not_answered(ctx, spec, step.id, probe, relaunched)
    await ctx.clock.sleep(spec.settle_s)
    after = await _prefix_counters(ctx, spec, http)
    if before is None or after is None:
        return StepOutcome(step.id, pb.LADDER_OUTCOME_CACHE_MISS, "no prefix-cache counters at /metrics", relaunched)
    queries, hits = after[0] - before[0], after[1] - before[1]
    detail = f"second request: {hits:,.0f} of {queries:,.0f} prompt tokens served from the prefix cache"
    outcome = pb.LADDER_OUTCOME_CACHE_HIT if hits > 0 else pb.LADDER_OUTCOME_CACHE_MISS
    return StepOutcome(step.id, outcome, detail, relaunched)


async def _not_answered(
    ctx: RunContext, spec: LadderSpec, step: str, result: pb.RequestResult, relaunched: bool
) -> StepOutcome:
    if probes.refused_as_invalid(result):
        return _refused(step, result, relaunched)
    return await _request_failed(ctx, spec, step, result, relaunched)


async def _prefix_counters(
    ctx: RunContext, spec: LadderSpec, http: aiohttp.ClientSession
) -> tuple[float, float] | None:
    text = await probes.get_text(http, f"{ctx.session.base_url}/metrics")
    if text is None:
        return None
    queries, hits = counter_total(text, spec.prefix_queries), counter_total(text, spec.prefix_hits)
    return None if queries is None or hits is None else (queries, hits)


async def _token_budget(ctx: RunContext, http: aiohttp.ClientSession, fraction: float) -> int:
    """Prompt tokens a probe may use: `fraction` of what both the running server (its /v1/models max_model_len)
    and the deployment (its --max-model-len) accept, leaving room for the request's max_tokens. A prompt longer
    than production ever takes tests what the deployment does not have."""
    limits: list[int] = []
    models = await probes.get_json(http, f"{ctx.session.base_url}/v1/models")
    for model in models.get("data", []) if isinstance(models, dict) else []:
        if isinstance(model, dict) and isinstance(model.get("max_model_len"), int):
            limits.append(int(model["max_model_len"]))
    for command in (ctx.session.running, ctx.command):
        flag = command.value("--max-model-len") if command is not None else None
        if isinstance(flag, str) and flag.isdigit():
            limits.append(int(flag))
    limit = min(limits, default=FALLBACK_MAX_MODEL_LEN)
    room = limit - int(probes.fixed_body(ctx).get("max_tokens") or 0) - 1
    return max(1, min(int(limit * fraction), room))


async def _request_failed(
    ctx: RunContext, spec: LadderSpec, step: str, result: pb.RequestResult, relaunched: bool
) -> StepOutcome:
    """A failed request is explained by the engine's first error when its log shows one (a request that timed
    out already gave the log its time)."""
    follower = ctx.session.follower
    if follower is not None and not probes.timed_out(result):
        await follower.wait_first_error()
    error = follower.first_error.result() if follower is not None and follower.first_error.done() else None
    error = error or await probes.hang_of(ctx, result)
    summary = result.error or f"HTTP {result.http_status}"
    if error is None:
        said = signature(default_rules(), "request", "request_error", summary)
        return _failed(
            spec,
            step,
            summary,
            Attempt("request", "request_error", said, foreign=foreign_now(ctx), proxy=ctx.session.running_proxies),
            relaunched,
        )
    not_reusable(ctx)
    summary = f"failed in {error.phase} ({error.category}): {error.line}"
    return _failed(spec, step, summary, attempt_of(ctx, error), relaunched)


def _failed(spec: LadderSpec, step: str, summary: str, failure: Attempt, relaunched: bool) -> StepOutcome:
    outcome = from_id(pb.LadderOutcome, spec.outcomes.get(failure.category, LadderOutcome.CRASH))
    return StepOutcome(step, outcome, summary, relaunched, failure)


async def _repeat(ctx: RunContext, spec: LadderSpec, trigger: StepOutcome) -> None:
    """Attempts the trigger step again, on top of the configuration it failed on, to show it repeats."""
    assert trigger.failure is not None
    ctx.evidence.attempts.append(trigger.failure)
    step = next(s for s in spec.steps if s.id == trigger.step)
    base = ctx.plan.stable
    for number in range(2, ctx.config.engine.failure_attempts + 1):

        async def again(source: str = f"ladder/{step.id}/repeat-{number}") -> Attempt:
            ctx.plan.stable = _before(ctx, trigger)
            outcome = await _step(ctx, spec, step, source)
            return outcome.failure or NOT_FAILED

        ctx.evidence.attempts.append(await proxies.repeat(ctx, trigger.failure, again))
    ctx.plan.stable = base


def _before(ctx: RunContext, trigger: StepOutcome) -> ServeCommand:
    """The stable configuration the trigger step was added to (the steps before it that held)."""
    command = ctx.command.minimal()
    for outcome in ctx.evidence.steps:
        if outcome is trigger:
            break
        flags = next(s.flags for s in ladder_spec().steps if s.id == outcome.step)
        if flags and outcome.failure is None and outcome.outcome != pb.LADDER_OUTCOME_NOT_APPLICABLE:
            command = command.with_step_from(ctx.command, flags)
    return command


async def probe(ctx: RunContext, step_id: str) -> StepOutcome:
    """A step's probe on the server that is running (a minimize test sends what the trigger step sent)."""
    spec = ladder_spec()
    step = next(s for s in spec.steps if s.id == step_id)
    return await _probe(ctx, spec, step, relaunched=True)
