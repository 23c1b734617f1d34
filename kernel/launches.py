"""A run's engine launches, folded event by event: the report's launch list, the timeline picture and the
runner's engine-time metrics all read these spans (the bot's RunRecord and the runner's metrics each hold a
fold; there is no other definition of a launch).

A launch begins with its `launch_started` event; it is alive from then to its last line, phase, error or
answer (a lower bound of its GPU time: the process lives a moment longer while it stops).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from protos import runner_pb2 as pb
from protos.vocab import LadderOutcome, member, to_id

# Events that show the launch's engine still alive (its log, its phases, its answers).
ALIVE = ("phase_reached", "log_chunk", "first_error", "request_result", "ladder_step")


@dataclass
class LaunchSpan:
    """One engine launch, in seconds since the run's first event."""

    stage: str
    start: float
    source: str  # its log's source, which names the launch ("ladder/prefix_caching/repeat-2/proxy")
    line: str  # the command as launched, redacted
    proxies: tuple[tuple[str, str], ...] = ()  # a proxy launch's (id, what it removes), runner/data/proxies.toml
    end: float = 0.0
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, reached at)
    failure: tuple[float, str, str] | None = None  # (at, phase, category) of its first error
    signature: str = ""
    steps: list[tuple[float, str, LadderOutcome | None]] = field(default_factory=list)  # (at, step, outcome)

    @property
    def proxy(self) -> bool:
        return bool(self.proxies)

    @property
    def label(self) -> str:
        name = self.source.removesuffix("/proxy")
        return name.replace("/", ": ", 1) if name.startswith("ladder/") else name

    def segments(self) -> list[tuple[str, float, float]]:
        """(phase, from, to): each phase lasts until the next is reached, the last until the launch ends."""
        if not self.phases:  # stopped before it logged a phase (a cancel): nothing to draw
            return []
        ends = [at for _, at in self.phases[1:]] + [self.end]
        return [(phase, at, max(end, at)) for (phase, at), end in zip(self.phases, ends, strict=True)]


class LaunchFold:
    """The launches of one run's events, in order, with what each reached, where it failed and the steps it
    served."""

    def __init__(self) -> None:
        self.spans: list[LaunchSpan] = []
        self._stage = ""
        self._start: float | None = None

    @classmethod
    def of(cls, events: Iterable[pb.RunEvent]) -> list[LaunchSpan]:
        fold = cls()
        for event in events:
            fold.apply(event)
        return fold.spans

    def apply(self, event: pb.RunEvent) -> None:
        kind = event.WhichOneof("payload")
        if kind is None or kind == "heartbeat":
            return
        at = event.at.ToNanoseconds() / 1e9
        self._start = at if self._start is None else self._start
        at -= self._start
        if kind == "stage_started":
            self._stage = to_id(pb.Stage, event.stage_started.stage)
        elif kind == "launch_started":
            started = event.launch_started
            proxies = tuple((p.id, p.removes) for p in started.proxies)
            self.spans.append(LaunchSpan(self._stage, at, started.source, started.line, proxies, end=at))
        current = self.spans[-1] if self.spans else None
        if current is None or kind not in ALIVE:
            return
        current.end = at
        if kind == "phase_reached":
            current.phases.append((to_id(pb.Phase, event.phase_reached.phase), at))
        elif kind == "first_error" and current.failure is None and not event.first_error.update:
            error = event.first_error
            phase, category = to_id(pb.Phase, error.phase), to_id(pb.ErrorCategory, error.category)
            current.failure, current.signature = (at, phase, category), error.signature
            if not current.phases:
                current.phases.append((phase, at))
        elif kind == "ladder_step":
            step = event.ladder_step
            if step.outcome != pb.LADDER_OUTCOME_NOT_APPLICABLE:
                current.steps.append((at, step.step, member(LadderOutcome, step.outcome)))
