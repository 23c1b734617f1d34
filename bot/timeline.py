"""A run's timeline as one PNG: each engine launch a bar split by the phases it reached, the failure marked
with its category, ladder steps labelled, proxy launches hatched. Drawn from the run's record (its launches,
kernel/launches.py's, the same the runner's engine-time metric counts), so any run the store (or an imported
bundle) holds can be drawn, long after its runner is gone.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import IO

from kernel.launches import LaunchSpan
from protos.vocab import PHASES, LadderOutcome

# One colour per phase (matplotlib's tab10, in phase order), so a phase looks the same in every picture.
COLOURS = dict(zip(PHASES, ("#7f7f7f", "#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c", "#17becf"), strict=True))
OUTCOME_TEXT = {
    LadderOutcome.OK: "ok",
    LadderOutcome.CACHE_HIT: "hit",
    LadderOutcome.CACHE_MISS: "miss",
    LadderOutcome.NOT_APPLICABLE: "n/a",
}
DRAWING = threading.Lock()  # matplotlib is not thread-safe, and the bot draws each run's picture off its loop


def draw(bars: list[LaunchSpan], path: Path | IO[bytes], title: str) -> int:
    """Writes the timeline PNG to `path` (a file, or a buffer for Slack and the bundle); returns the number
    of launches drawn."""
    with DRAWING:
        return _draw(bars, path, title)


def _draw(bars: list[LaunchSpan], path: Path | IO[bytes], title: str) -> int:
    # matplotlib takes ~0.5 s to import: only a command that draws pays for it, not every `k3repro` call
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

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
            text = "  ".join(
                f"{step}: {OUTCOME_TEXT.get(outcome, outcome) if outcome else ''}" for _, step, outcome in bar.steps
            )
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


def png(bars: list[LaunchSpan], title: str) -> bytes:
    """The picture as bytes: posted in the run's thread with its verdict, and a member of its bundle."""
    buffer = io.BytesIO()
    draw(bars, buffer, title)
    return buffer.getvalue()


def caption(run_id: str, cluster: str, outcome: str) -> str:
    """The picture's title, the same wherever it is drawn."""
    return f"run {run_id} · cluster {cluster} · {outcome}"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
