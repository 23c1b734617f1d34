"""A run's timeline as one PNG: each engine launch a bar split by the phases it reached, the failure marked
with its category, ladder steps labelled, proxy launches hatched. Drawn from the run's stored events only, so
any run the store (or an imported bundle) holds can be drawn, long after its runner is gone.

The event stream has no "launch started" event: a launch begins where the phases start again (a phase no later
than the one last reached), or with a first error when the launch before already had one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from protos import runner_pb2 as pb
from protos.vocab import PHASES, to_id

# One colour per phase (matplotlib's tab10, in phase order), so a phase looks the same in every picture.
COLOURS = dict(zip(PHASES, ("#7f7f7f", "#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c", "#17becf"), strict=True))
# Events that show the launch's engine still alive (its log, its phases, its answers).
ALIVE = ("phase_reached", "log_chunk", "first_error", "request_result", "ladder_step")
OUTCOME_TEXT = {"ok": "ok", "cache_hit": "hit", "cache_miss": "miss", "not_applicable": "n/a"}


@dataclass
class Bar:
    """One engine launch, in seconds since the run's first event."""

    stage: str
    start: float
    proxy: bool
    end: float = 0.0
    phases: list[tuple[str, float]] = field(default_factory=list)  # (phase, reached at)
    failure: tuple[float, str, str] | None = None  # (at, phase, category) of its first error
    signature: str = ""
    steps: list[tuple[float, str, str]] = field(default_factory=list)  # (at, ladder step, outcome)

    @property
    def label(self) -> str:
        if self.stage != "ladder":
            return self.stage
        relaunched = next((step for _, step, _ in self.steps), "")
        return f"ladder: {relaunched}" if relaunched else "ladder: trigger step repeated"

    def segments(self) -> list[tuple[str, float, float]]:
        """(phase, from, to): each phase lasts until the next is reached, the last until the launch ends."""
        ends = [at for _, at in self.phases[1:]] + [self.end]
        return [(phase, at, max(end, at)) for (phase, at), end in zip(self.phases, ends, strict=True)]


def launches(events: Iterable[pb.RunEvent]) -> list[Bar]:
    """The run's launches, in order, with what each reached, where it failed and the steps it served."""
    bars: list[Bar] = []
    stage = ""
    proxy_next = False
    start: float | None = None
    for event in events:
        at = event.at.ToNanoseconds() / 1e9
        start = at if start is None else start
        at -= start
        kind = event.WhichOneof("payload")
        current = bars[-1] if bars else None
        if kind == "stage_started":
            stage = to_id(pb.Stage, event.stage_started.stage)
        elif kind == "artifact" and event.artifact.name == "proxy_launch":
            proxy_next = True  # announced just before the launch it describes
        elif kind == "phase_reached":
            phase = to_id(pb.Phase, event.phase_reached.phase)
            last = current.phases[-1][0] if current is not None and current.phases else None
            if current is None or last is None or PHASES.index(phase) <= PHASES.index(last):
                current = Bar(stage, at, proxy_next)
                bars.append(current)
                proxy_next = False
            current.phases.append((phase, at))
        elif kind == "first_error":
            error = event.first_error
            if current is not None and current.failure is not None and current.signature == error.signature:
                current.end = at  # the same error again, updated (an OOM seen after it)
                continue
            if current is None or current.failure is not None:  # failed before any phase was reached
                current = Bar(stage, at, proxy_next)
                bars.append(current)
                proxy_next = False
            phase, category = to_id(pb.Phase, error.phase), to_id(pb.ErrorCategory, error.category)
            current.failure, current.signature = (at, phase, category), error.signature
            if not current.phases:
                current.phases.append((phase, at))
        elif kind == "ladder_step" and current is not None:
            step = event.ladder_step
            if step.outcome != pb.LADDER_OUTCOME_NOT_APPLICABLE:
                current.steps.append((at, to_id(pb.LadderStepId, step.step), to_id(pb.LadderOutcome, step.outcome)))
        if current is not None and kind in ALIVE:
            current.end = at
    return bars


def draw(events: list[pb.RunEvent], path: Path, title: str) -> int:
    """Writes the timeline PNG to `path`; returns the number of launches drawn."""
    bars = launches(events)
    figure = Figure(figsize=(12, 1.6 + 0.55 * max(1, len(bars))), dpi=110, layout="constrained")
    axes = figure.subplots()
    span = max([bar.end for bar in bars], default=1.0) or 1.0
    for row, bar in enumerate(bars):
        for phase, begin, end in bar.segments():
            width = max(end - begin, span / 400)
            axes.barh(
                row, width, left=begin, height=0.6, color=COLOURS[phase], edgecolor="white",
                hatch="//" if bar.proxy else None, alpha=0.75 if bar.proxy else 1.0,
            )  # fmt: skip
            if width > span / 25:
                axes.text(begin + width / 2, row, _seconds(end - begin), ha="center", va="center", fontsize=8)
        if bar.failure is not None:
            at, phase, category = bar.failure
            axes.plot(at, row, marker="X", markersize=13, color="#d62728", markeredgecolor="black", zorder=3)
            axes.annotate(
                f"{category} ({phase})", (at, row), xytext=(0, -17), textcoords="offset points",
                ha="center", va="top", fontsize=8, color="#d62728", fontweight="bold",
            )  # fmt: skip
        if bar.steps:
            text = "  ".join(f"{step}: {OUTCOME_TEXT.get(outcome, outcome)}" for _, step, outcome in bar.steps)
            axes.annotate(
                text, (bar.end, row), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8
            )  # fmt: skip
    axes.set_yticks(
        range(len(bars)),
        [f"#{row + 1} {bar.label}{' (proxy)' if bar.proxy else ''}" for row, bar in enumerate(bars)],
    )
    axes.set_ylim(len(bars) - 0.4, -0.8)  # first launch on top
    axes.set_xlim(0, span * 1.3)  # room for the step labels after the last bar
    axes.set_xlabel("seconds since the run started")
    axes.grid(axis="x", alpha=0.3)
    axes.set_title(title, loc="left", fontsize=10)
    seen = dict.fromkeys(phase for bar in bars for phase, _ in bar.phases)
    handles: list[Patch] = [Patch(color=COLOURS[phase], label=phase) for phase in PHASES if phase in seen]
    if any(bar.proxy for bar in bars):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="proxy launch"))
    if handles:
        figure.legend(handles=handles, loc="outside upper right", fontsize=8, ncols=len(handles), frameon=False)
    figure.savefig(path, format="png")
    return len(bars)


def write_timeline(run: dict[str, Any], events: list[pb.RunEvent], path: Path) -> str:
    """`k3repro show RUN --timeline FILE`: draws the run into `path`; returns the line that says so."""
    outcome = run["decision"] or run["status"]
    drawn = draw(events, path, f"run {run['id']} · cluster {run['cluster']} · {outcome}")
    return f"timeline of {drawn} launch(es) written to {path}"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
