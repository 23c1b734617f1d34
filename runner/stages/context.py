"""What the stages of one run share."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from kernel.clock import Clock
from kernel.vllm_cli import ServeCommand
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, UNKNOWN_PHASE, to_id
from runner.config import RunnerConfig
from runner.engines import EngineBackend, RunningEngine

if TYPE_CHECKING:  # the follower's module needs Emit from here
    from runner.stages.log_follower import LogFollower

Emit = Callable[..., Awaitable[pb.RunEvent]]


@dataclass(frozen=True)
class Attempt:
    """One attempt at reproducing the failure, of three kinds: a failure in a phase (`failed`: where and how),
    `Attempt.did_not_fail()` (NOT_FAILED, `held`: it launched and answered), or `Attempt.inconclusive()` (neither:
    no phase, and what happened instead)."""

    phase: str
    category: str
    signature: str
    secondary_oom: bool = False
    foreign: bool = False  # the launch started while other processes held GPU memory: not evidence
    during: str = ""  # the log stretch it happened in (the analyzer's context, e.g. cudagraph_capture)
    proxy: tuple[str, ...] = ()  # the proxies (runner/data/proxies.toml) of the launch that showed it
    line: str = ""  # the first error's line as logged, when the analyzer found one
    waits: str = ""  # a hang's: where the engine's processes waited, from their stacks (runner/stacks/)

    @classmethod
    def did_not_fail(cls, proxy: tuple[str, ...] = ()) -> Attempt:
        """The attempt launched and answered (the probe too, where one was sent): the failure did not show."""
        return cls("", "", "", proxy=proxy)

    @classmethod
    def inconclusive(cls, what: str, category: str = "other", proxy: tuple[str, ...] = ()) -> Attempt:
        """Neither a failure in a phase nor an answer: `what` happened (a launch that stopped without a first error
        or a named way of failing, a probe the server refused as invalid)."""
        return cls("", category, what, proxy=proxy)

    @property
    def failed(self) -> bool:
        """Whether it failed in a phase: what every reader counts as the failure met (never NOT_FAILED)."""
        return bool(self.phase)

    @property
    def held(self) -> bool:
        """Whether it is the did-not-fail value (of any proxy): neither a failure nor inconclusive."""
        return not (self.phase or self.category or self.signature)

    def same_as(self, other: Attempt | pb.FirstError) -> bool:
        """The one meaning of "the same failure": an equal normalised first-error signature, which carries the
        phase and the category (kernel/analyzer/signature.py); never identical text. Where one side's phase is
        unknown (a pasted excerpt that does not show it), nothing is decided from the phase or the category that
        follows from it: the normalised messages alone are compared."""
        if not self.signature or not other.signature:
            return False
        if self.signature == other.signature:
            return True
        mine, theirs = self.signature.split(":", 2), other.signature.split(":", 2)
        unknown = UNKNOWN_PHASE in (mine[0], theirs[0])
        return unknown and len(mine) == len(theirs) == 3 and mine[2] == theirs[2]


NOT_FAILED: Final = Attempt.did_not_fail()


@dataclass(frozen=True)
class StepOutcome:
    step: str
    outcome: pb.LadderOutcome
    detail: str
    relaunched: bool
    failure: Attempt | None = None
    added: tuple[str, ...] = ()  # the flags the step added to the last stable configuration, as written


@dataclass
class StageResult:
    status: pb.StageStatus
    summary: str


@dataclass
class Evidence:
    """What the run found, appended by the stage that finds it and read by the verdict: freeze (fingerprint, the
    first driver and image), the launcher (drivers, images and GPU memory holders before each launch),
    minimal_launch, single_request and ladder (attempts), ladder (steps), minimal_launch (diagnosis),
    cache_control (stale_caches), and RunContext.check (checklist). Nothing here is ever taken back."""

    checklist: dict[pb.ChecklistId, tuple[pb.ChecklistState, str]] = field(default_factory=dict)
    fingerprint: dict[str, Any] | None = None  # the frozen scene
    attempts: list[Attempt] = field(default_factory=list)  # every attempt at the failure being reproduced
    steps: list[StepOutcome] = field(default_factory=list)  # the ladder, in order
    holders: list[frozenset[int]] = field(default_factory=list)  # pids holding GPU memory before each launch
    holder_notes: dict[int, str] = field(default_factory=dict)  # pid -> "pid 4242 (python3) 40960 MiB on 8 GPUs"
    drivers: list[str] = field(default_factory=list)  # the NVIDIA driver NVML reported at freeze and before each launch
    images: list[str] = field(default_factory=list)  # the image id the frozen tag resolved to, then each launch ran
    diagnosis: str = ""  # the --enforce-eager diagnostic's answer, when the minimal launch ran it
    stale_caches: tuple[str, ...] = ()  # the host's caches to clear, when the fresh-cache control answered


@dataclass
class EngineSession:
    """The live engine and what it was launched with: written only by the launcher (runner/stages/launcher.py),
    which starts and releases it, and which a stage tells (launcher.not_reusable) when the engine logged a fatal
    error. GPU time is the scarce resource: every launch is counted here."""

    engine: RunningEngine | None = None
    base_url: str = ""
    follower: LogFollower | None = None  # the live engine's log follower
    running: ServeCommand | None = None  # what the live engine was launched with (None: no engine to reuse)
    running_proxies: tuple[str, ...] = ()  # the proxies the live (or last) engine was launched with
    launches: int = 0


@dataclass
class Plan:
    """What the method launches next. `stable` is moved by the stages that find a configuration that answers
    (single_request, then ladder: its steps, and its repeats of the trigger, which put it back); the proxy fields
    only by runner/stages/proxies.py."""

    stable: ServeCommand | None = None  # the last configuration that launched and answered
    proxy_for: Attempt | None = None  # set: launches now are proxies for repeating this failure
    ladder_proxies: bool = False  # ladder relaunches may use the ladder's proxies (a real launch answered)


@dataclass
class Verdict:
    """The run's conclusion: written only by the verdict stage (runner/stages/verdict.py)."""

    decision: pb.Decision = pb.DECISION_UNSPECIFIED
    reasons: list[str] = field(default_factory=list)
    headline: str = ""  # the verdict as one line: cause, evidence, next action (stages/verdict_line.py)


@dataclass
class RunContext:
    """One run: what it was asked (identity, fixed at start), where it is (`stage`, `stopped_at`: written only by
    runner/pipeline.py) and its parts, each with its owner: evidence, the engine session, the plan, the verdict."""

    run_id: str
    request: pb.StartRunRequest
    command: ServeCommand
    config: RunnerConfig
    backend: EngineBackend
    emit: Emit
    stage: pb.Stage = pb.STAGE_UNSPECIFIED
    stopped_at: tuple[str, str] | None = None  # the stage that did not succeed, and its summary
    evidence: Evidence = field(default_factory=Evidence)
    session: EngineSession = field(default_factory=EngineSession)
    plan: Plan = field(default_factory=Plan)
    verdict: Verdict = field(default_factory=Verdict)

    def unsettled(self) -> list[str]:
        """The checklist items that neither hold nor do not apply, in the checklist's order: what `fix` needs."""
        settled = (pb.CHECKLIST_STATE_HOLDS, pb.CHECKLIST_STATE_NOT_APPLICABLE)
        states = {to_id(pb.ChecklistId, item): state for item, (state, _) in self.evidence.checklist.items()}
        return [item for item in CHECKLIST_IDS if states.get(item) not in settled]

    @property
    def clock(self) -> Clock:
        """The engine's time, as its backend counts it: every wait on the engine uses it (kernel/clock.py)."""
        return self.backend.clock

    async def check(self, item: pb.ChecklistId, state: pb.ChecklistState, evidence: str) -> None:
        """Records a checklist item once it has evidence (or changes), as an event."""
        if self.evidence.checklist.get(item) == (state, evidence):
            return
        self.evidence.checklist[item] = (state, evidence)
        await self.emit(checklist_item=pb.ChecklistItem(item=item, state=state, evidence=evidence))

    async def artifact(self, name: str, content: Any) -> None:
        if isinstance(content, str):
            await self.emit(artifact=pb.Artifact(name=name, media_type="text/plain", content=content))
        else:
            text = json.dumps(content, indent=2, sort_keys=True)
            await self.emit(artifact=pb.Artifact(name=name, media_type="application/json", content=text))
