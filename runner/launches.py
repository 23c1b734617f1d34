"""A run's engine launches, told from its event stream: what the timeline picture draws and the engine time the
runner's metrics count.

The stream has no "launch started" event: a launch begins where the phases start again (a phase no later than
the one last reached), or with a first error when the launch before already had one. It is alive from its
first phase line to its last line or answer (a lower bound: the process starts a moment before it logs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from protos import runner_pb2 as pb
from protos.vocab import PHASES, to_id

# Events that show the launch's engine still alive (its log, its phases, its answers).
ALIVE = ("phase_reached", "log_chunk", "first_error", "request_result", "ladder_step")


def proxy_note(source: str, proxies: tuple[tuple[str, str], ...], line: str) -> str:
    """How the thread, the report and the bundle label a proxy launch (one line); `proxies`: (id, what it removes)."""
    ids, removes = " + ".join(p for p, _ in proxies), "; no ".join(r for _, r in proxies)
    return f"{source}: {ids} (no {removes}) — {line}"


def proxies_of(note: str) -> tuple[tuple[str, str], ...]:
    """The (id, what it removes) pairs a `proxy_note` names."""
    named = note.split(": ", 1)[-1].split(" — ", 1)[0]
    ids, _, removes = named.partition(" (no ")
    return tuple(zip(ids.split(" + "), removes.removesuffix(")").split("; no "), strict=False))


@dataclass
class LaunchSpan:
    """One engine launch, in seconds since the run's first event."""

    stage: str
    start: float
    proxy: bool
    end: float = 0.0
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, reached at)
    failure: tuple[float, str, str] | None = None  # (at, phase, category) of its first error
    signature: str = ""
    steps: list[tuple[float, str, str]] = field(default_factory=list)  # (at, ladder step, outcome)
    source: str = ""  # its log's source, which names the launch ("ladder/prefix_caching/repeat-2/proxy")
    proxies: tuple[tuple[str, str], ...] = ()  # a proxy launch's (id, what it removes), runner/data/proxies.toml

    @property
    def label(self) -> str:
        if self.source:
            name = self.source.removesuffix("/proxy")
            return name.replace("/", ": ", 1) if name.startswith("ladder/") else name
        if self.stage != "ladder":
            return self.stage
        relaunched = next((step for _, step, _ in self.steps), "")
        return f"ladder: {relaunched}" if relaunched else "ladder: trigger step repeated"

    def segments(self) -> list[tuple[str, float, float]]:
        """(phase, from, to): each phase lasts until the next is reached, the last until the launch ends."""
        ends = [at for _, at in self.phases[1:]] + [self.end]
        return [(phase, at, max(end, at)) for (phase, at), end in zip(self.phases, ends, strict=True)]


def launches(events: Iterable[pb.RunEvent]) -> list[LaunchSpan]:
    """The run's launches, in order, with what each reached, where it failed and the steps it served."""
    spans: list[LaunchSpan] = []
    stage = ""
    proxy_next: tuple[tuple[str, str], ...] = ()
    start: float | None = None
    for event in events:
        at = event.at.ToNanoseconds() / 1e9
        start = at if start is None else start
        at -= start
        kind = event.WhichOneof("payload")
        current = spans[-1] if spans else None
        if kind == "stage_started":
            stage = to_id(pb.Stage, event.stage_started.stage)
        elif kind == "artifact" and event.artifact.name == "proxy_launch":
            proxy_next = proxies_of(event.artifact.content)  # announced just before the launch it describes
        elif kind == "phase_reached":
            phase = to_id(pb.Phase, event.phase_reached.phase)
            last = current.phases[-1][0] if current is not None and current.phases else None
            if current is None or last is None or PHASES.index(phase) <= PHASES.index(last):
                current = LaunchSpan(stage, at, bool(proxy_next), proxies=proxy_next)
                spans.append(current)
                proxy_next = ()
            current.phases.append((phase, at))
        elif kind == "first_error":
            error = event.first_error
            if current is not None and current.failure is not None and current.signature == error.signature:
                current.end = at  # the same error again, updated (an OOM seen after it)
                continue
            if current is None or current.failure is not None:  # failed before any phase was reached
                current = LaunchSpan(stage, at, bool(proxy_next), proxies=proxy_next)
                spans.append(current)
                proxy_next = ()
            phase, category = to_id(pb.Phase, error.phase), to_id(pb.ErrorCategory, error.category)
            current.failure, current.signature = (at, phase, category), error.signature
            if not current.phases:
                current.phases.append((phase, at))
        elif kind == "log_chunk" and current is not None and not current.source:
            current.source = event.log_chunk.source  # a launch's log is sent after its first phase is reached
        elif kind == "ladder_step" and current is not None:
            step = event.ladder_step
            if step.outcome != pb.LADDER_OUTCOME_NOT_APPLICABLE:
                current.steps.append((at, step.step, to_id(pb.LadderOutcome, step.outcome)))
        if current is not None and kind in ALIVE:
            current.end = at
    return spans
