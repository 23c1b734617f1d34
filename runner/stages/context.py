"""What the stages of one run share."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kernel.clock import Clock
from kernel.vllm_cli import ServeCommand
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, UNKNOWN_PHASE, to_id
from runner.config import RunnerConfig
from runner.engines import EngineBackend, RunningEngine

Emit = Callable[..., Awaitable[pb.RunEvent]]


@dataclass(frozen=True)
class Attempt:
    """One attempt at reproducing the failure: where it failed (or "" when it did not fail) and how."""

    phase: str
    category: str
    signature: str
    secondary_oom: bool = False
    foreign: bool = False  # the launch started while other processes held GPU memory: not evidence
    during: str = ""  # the log stretch it happened in (the analyzer's context, e.g. cudagraph_capture)
    proxy: tuple[str, ...] = ()  # the proxies (runner/data/proxies.toml) of the launch that showed it
    line: str = ""  # the first error's line as logged, when the analyzer found one
    waits: str = ""  # a hang's: where the engine's processes waited, from their stacks (runner/stacks/)

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
class RunContext:
    run_id: str
    request: pb.StartRunRequest
    command: ServeCommand
    config: RunnerConfig
    backend: EngineBackend
    emit: Emit
    stage: pb.Stage = pb.STAGE_UNSPECIFIED
    engine: RunningEngine | None = None
    base_url: str = ""
    checklist: dict[pb.ChecklistId, tuple[pb.ChecklistState, str]] = field(default_factory=dict)
    follower: Any = None  # the LogFollower of the live engine, set by each launch
    running: ServeCommand | None = None  # what the live engine was launched with (None: no engine answers)
    launches: int = 0  # GPU time is the scarce resource: every launch is counted
    fingerprint: dict[str, Any] | None = None  # the frozen scene, set by freeze
    stable: ServeCommand | None = None  # the last configuration that launched and answered
    attempts: list[Attempt] = field(default_factory=list)  # every attempt at the failure being reproduced
    steps: list[StepOutcome] = field(default_factory=list)  # the ladder, in order
    holders: list[frozenset[int]] = field(default_factory=list)  # pids holding GPU memory before each launch
    holder_notes: dict[int, str] = field(default_factory=dict)  # pid -> "pid 4242 (python3) 40960 MiB on 8 GPUs"
    drivers: list[str] = field(default_factory=list)  # the NVIDIA driver NVML reported at freeze and before each launch
    images: list[str] = field(default_factory=list)  # the image id the frozen tag resolved to, then each launch ran
    proxy_for: Attempt | None = None  # set: launches now are proxies for repeating this failure (stages/proxies.py)
    running_proxies: tuple[str, ...] = ()  # the proxies the live (or last) engine was launched with
    ladder_proxies: bool = False  # ladder relaunches may use the ladder's proxies (a real launch answered)
    decision: pb.Decision = pb.DECISION_UNSPECIFIED  # set by verdict
    reasons: list[str] = field(default_factory=list)
    headline: str = ""  # the verdict as one line: cause, evidence, next action (stages/verdict_line.py)
    diagnosis: str = ""  # the --enforce-eager diagnostic's answer, when the minimal launch ran it
    stale_caches: tuple[str, ...] = ()  # the host's caches to clear, when the fresh-cache control answered
    stopped_at: tuple[str, str] | None = None  # the stage that did not succeed, and its summary

    def unsettled(self) -> list[str]:
        """The checklist items that neither hold nor do not apply, in the checklist's order: what `fix` needs."""
        settled = (pb.CHECKLIST_STATE_HOLDS, pb.CHECKLIST_STATE_NOT_APPLICABLE)
        states = {to_id(pb.ChecklistId, item): state for item, (state, _) in self.checklist.items()}
        return [item for item in CHECKLIST_IDS if states.get(item) not in settled]

    @property
    def clock(self) -> Clock:
        """The engine's time, as its backend counts it: every wait on the engine uses it (kernel/clock.py)."""
        return self.backend.clock

    async def check(self, item: pb.ChecklistId, state: pb.ChecklistState, evidence: str) -> None:
        """Records a checklist item once it has evidence (or changes), as an event."""
        if self.checklist.get(item) == (state, evidence):
            return
        self.checklist[item] = (state, evidence)
        await self.emit(checklist_item=pb.ChecklistItem(item=item, state=state, evidence=evidence))

    async def artifact(self, name: str, content: Any) -> None:
        if isinstance(content, str):
            await self.emit(artifact=pb.Artifact(name=name, media_type="text/plain", content=content))
        else:
            text = json.dumps(content, indent=2, sort_keys=True)
            await self.emit(artifact=pb.Artifact(name=name, media_type="application/json", content=text))
