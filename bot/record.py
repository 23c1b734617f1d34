"""A run's record: the one fold of its events, of which every view of a run is a projection.

The card, the checklist and the thread (bot/blocks.py, bot/slack/threads.py), the terminal (bot/render.py),
the JSON report (bot/report.py), the bundle (bot/bundle.py) and the rerun comparison (bot/rerun.py) all read
a `RunRecord`. Wire enums become the vocabulary's ids and StrEnum members here and nowhere else (`fact_of`), the first error is
defined here (`RunRecord.first_error`), and the frozen scene is parsed here once. The same events give the
same record, which is what lets a restarted bot rebuild a thread's state from the store and carry on.
A new event kind is taught in `fact_of` and `RunRecord.apply`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from bot.store import FINAL, Run, RunState
from kernel import images
from kernel.launches import LaunchFold, LaunchSpan
from protos import runner_pb2 as pb
from protos.vocab import ChecklistState, Decision, LadderOutcome, RunStatus, StageStatus, member, to_id


@dataclass(frozen=True)
class StageStarted:
    stage: str
    detail: str


@dataclass(frozen=True)
class StageResult:
    stage: str
    status: StageStatus | None  # None: the runner left it unset (so for every wire enum below)
    summary: str


@dataclass(frozen=True)
class PhaseReached:
    phase: str


@dataclass(frozen=True)
class FirstError:
    stage: str
    phase: str
    category: str
    line: str
    signature: str
    secondary_oom: bool
    context: tuple[str, ...]
    hint: str
    repeat: bool = False  # this run showed an error with the same signature already (a relaunch, a ladder step)
    update: bool = False  # restates the launch's first error with what was learnt since (the wire says so)
    stacks: tuple[str, ...] = ()  # a hang's: where the engine's processes waited, the headline first (py-spy)


@dataclass(frozen=True)
class Check:
    item: str
    state: ChecklistState  # pending: no evidence yet
    evidence: str

    @property
    def holds(self) -> bool:
        return self.state == ChecklistState.HOLDS


@dataclass(frozen=True)
class LadderStep:
    step: str
    outcome: LadderOutcome | None
    detail: str
    relaunched: bool
    signature: str  # of the failure the step hit; "" when it did not fail
    phase: str
    category: str
    wire: pb.LadderStepResult = field(compare=False, repr=False)  # the bundle keeps the step as sent


@dataclass(frozen=True)
class Finished:
    status: RunStatus | None
    decision: Decision | None  # None without one
    reasons: tuple[str, ...]
    summary: str
    launches: int
    headline: str = ""  # the verdict as one line: cause, evidence, next action


Fact = (
    StageStarted
    | StageResult
    | PhaseReached
    | FirstError
    | Check
    | LadderStep
    | pb.LaunchStarted
    | pb.LogChunk
    | pb.RequestResult
    | pb.Artifact
    | Finished
)


def fact_of(event: pb.RunEvent, stage: str = "") -> Fact | None:
    """An event in the vocabulary's ids (`stage`: the one running, for a first error); None for a heartbeat."""
    kind = event.WhichOneof("payload")
    if kind == "stage_started":
        return StageStarted(to_id(pb.Stage, event.stage_started.stage), event.stage_started.detail)
    if kind == "stage_finished":
        m = event.stage_finished
        return StageResult(to_id(pb.Stage, m.stage), member(StageStatus, m.status), m.summary)
    if kind == "phase_reached":
        return PhaseReached(to_id(pb.Phase, event.phase_reached.phase))
    if kind == "first_error":
        e = event.first_error
        return FirstError(
            stage,
            to_id(pb.Phase, e.phase),
            to_id(pb.ErrorCategory, e.category),
            e.line,
            e.signature,
            e.secondary_oom,
            tuple(e.context),
            e.hint,
            stacks=tuple(e.stacks),
            update=e.update,
        )
    if kind == "checklist_item":
        c = event.checklist_item
        state = member(ChecklistState, c.state) or ChecklistState.PENDING  # unset: no evidence, which pending means
        return Check(to_id(pb.ChecklistId, c.item), state, c.evidence)
    if kind == "ladder_step":
        s = event.ladder_step
        return LadderStep(
            s.step,
            member(LadderOutcome, s.outcome),
            s.detail,
            s.relaunched,
            s.signature,
            to_id(pb.Phase, s.phase),
            to_id(pb.ErrorCategory, s.category),
            s,
        )
    if kind == "run_finished":
        f = event.run_finished
        return Finished(
            member(RunStatus, f.status),
            member(Decision, f.decision),
            tuple(f.reasons),
            f.summary,
            f.launches,
            f.headline,
        )
    if kind == "launch_started":
        return event.launch_started
    if kind == "log_chunk":
        return event.log_chunk
    if kind == "request_result":
        return event.request_result
    if kind == "artifact":
        return event.artifact
    return None


@dataclass
class RunRecord:
    run_id: str
    cluster: str = ""
    runner: str = ""
    image: str = ""
    requested_by: str = ""
    status: RunState = RunState.RUNNING
    stage: str = ""
    phase: str = ""
    host: str = ""
    digest: str = ""
    problem: str = ""  # why the bot stopped following (lost, refused)
    minimize_of: str = ""  # a minimize run: the run whose flags it shrinks
    checklist: dict[str, Check] = field(default_factory=dict)  # latest by item, in the order first seen
    first_errors: dict[str, FirstError] = field(default_factory=dict)  # by stage
    notes: dict[str, list[pb.Artifact]] = field(default_factory=dict)  # one-line artifacts, by stage
    artifacts: dict[str, str] = field(default_factory=dict)  # content by name (the last one of a name)
    scene: dict[str, Any] | None = None  # the "fingerprint" artifact, parsed
    requests: list[pb.RequestResult] = field(default_factory=list)
    steps: list[StageResult | LadderStep] = field(default_factory=list)  # every stage's and step's result
    logs: dict[str, list[str]] = field(default_factory=dict)  # by source, e.g. "minimal_launch/stdout"
    finished: Finished | None = None
    signatures: set[str] = field(default_factory=set)  # of every first error seen
    launch_fold: LaunchFold = field(default_factory=LaunchFold, compare=False, repr=False)

    @classmethod
    def of(cls, run: Run) -> RunRecord:
        """A stored run before its events: a run the store holds as ended keeps its status and why."""
        record = cls(run.id, run.cluster, run.runner, run.image, run.requested_by)
        record.minimize_of = run.minimize_of
        if run.status in FINAL:
            record.status, record.problem = run.status, run.summary or ""
        return record

    @classmethod
    def replay(cls, run_id: str, events: Iterable[pb.RunEvent]) -> RunRecord:
        record = cls(run_id)
        for event in events:
            record.apply(event)
        return record

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def decision(self) -> Decision | None:
        return self.finished.decision if self.finished is not None else None

    @property
    def first_error(self) -> FirstError | None:
        """The run's first error: that of the first stage that had one."""
        return next(iter(self.first_errors.values()), None)

    @property
    def launches(self) -> list[LaunchSpan]:
        """Every engine launch so far, with what it reached and how it failed (kernel/launches.py)."""
        return self.launch_fold.spans

    @property
    def ladder(self) -> list[LadderStep]:
        return [step for step in self.steps if isinstance(step, LadderStep)]

    @property
    def trigger(self) -> LadderStep | None:
        """The ladder step that triggered the failure: the first one that failed."""
        return next((step for step in self.ladder if step.signature), None)

    def failure(self) -> dict[str, str] | None:
        """Where the run first failed and how: its first error, else the first stage that failed without one
        (e.g. a baseline the scene does not meet)."""
        error = self.first_error
        if error is not None:
            return {"phase": error.phase, "category": error.category, "signature": error.signature, "line": error.line}
        for result in self.steps:
            if isinstance(result, StageResult) and result.status == StageStatus.FAILED:
                signature = f"{result.stage}: {result.summary}"
                return {
                    "phase": result.stage,
                    "category": "stage_failed",
                    "signature": signature,
                    "line": result.summary,
                }
        return None

    def lost(self, status: RunState, problem: str) -> None:
        """The bot stopped following (the runner refused the run, or contact was lost)."""
        self.status, self.problem = status, problem

    def log_texts(self) -> dict[str, str]:
        """The run's whole log, one text per source."""
        return {source: "\n".join(lines) + "\n" for source, lines in self.logs.items()}

    def apply(self, event: pb.RunEvent) -> Fact | None:
        """Folds one event in; returns it as a fact, for the renderers that show events as they come."""
        fact = fact_of(event, self.stage)
        self.launch_fold.apply(event)
        if isinstance(fact, StageStarted):
            self.stage, self.phase = fact.stage, ""
        elif isinstance(fact, StageResult):
            self.steps.append(fact)
        elif isinstance(fact, PhaseReached):
            self.phase = fact.phase
        elif isinstance(fact, FirstError):
            fact = self._first_error(fact)
        elif isinstance(fact, Check):
            self.checklist[fact.item] = fact
        elif isinstance(fact, LadderStep):
            self.steps.append(fact)
        elif isinstance(fact, pb.LogChunk):
            self.logs.setdefault(fact.source, []).extend(fact.lines)
        elif isinstance(fact, pb.RequestResult):
            self.requests.append(fact)
        elif isinstance(fact, pb.Artifact):
            self._artifact(fact)
        elif isinstance(fact, Finished):
            self.finished, self.stage, self.phase = fact, "", ""
            if fact.status is not None:
                self.status = RunState(fact.status)
        return fact

    def _first_error(self, error: FirstError) -> FirstError:
        """A stage's first error is the one that counts (relaunches repeat it); an update (the wire's flag: an
        OOM seen after it makes it secondary) replaces the error it restates, and is no repeat."""
        if error.update:  # its launch may have outlived the stage that showed it (a failed engine kept running)
            for stage, shown in reversed(self.first_errors.items()):
                if (shown.line, shown.signature) == (error.line, error.signature):
                    self.first_errors[stage] = replace(error, stage=stage, repeat=shown.repeat)
                    break
            return error
        kept = self.first_errors.get(error.stage)
        error = replace(error, repeat=error.signature in self.signatures)
        self.signatures.add(error.signature)
        if kept is None:
            self.first_errors[error.stage] = error
        return error

    def _artifact(self, artifact: pb.Artifact) -> None:
        self.artifacts[artifact.name] = artifact.content
        if not is_file(artifact):
            self.notes.setdefault(self.stage, []).append(artifact)
        if artifact.name != "fingerprint":
            return
        try:
            scene = json.loads(artifact.content)
        except ValueError:
            return
        if not isinstance(scene, dict):
            return
        self.scene = scene
        host, image = scene.get("host") or {}, scene.get("image") or {}
        if isinstance(host, dict):
            self.host = str(host.get("hostname") or self.host)
        if isinstance(image, dict):
            self.image = str(image.get("ref") or self.image)
        self.digest = image_digest(scene) or self.digest


def image_digest(scene: dict[str, Any] | None) -> str:
    """ "sha256:…" of the image the scene ran, when the registry pinned one; "" when it is known by tag only."""
    image = (scene or {}).get("image") or {}
    if not isinstance(image, dict):
        return ""
    # freeze's pinned_ref first: the digest the run launched, of the tag's own repository
    refs = [str(image.get(key) or "") for key in ("pinned_ref", "ref")]
    refs += [str(ref) for ref in image.get("repo_digests") or []]
    return next((images.digest(ref) for ref in refs if images.is_pinned(ref)), "")


def is_file(artifact: pb.Artifact) -> bool:
    """Structured or multi-line evidence goes to a file; a one-liner is shown in the stage's message."""
    return artifact.media_type != "text/plain" or "\n" in artifact.content
