"""Run events as text for a terminal: one line per event a person cares about, in the order they happened."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from protos import runner_pb2 as pb
from protos.vocab import to_id

STATUS_MARK = {
    pb.STAGE_STATUS_OK: "✓",
    pb.STAGE_STATUS_FAILED: "✗",
    pb.STAGE_STATUS_SKIPPED: "–",
    pb.STAGE_STATUS_CANCELLED: "⊘",
}
CHECK_MARK = {pb.CHECKLIST_STATE_HOLDS: "☑", pb.CHECKLIST_STATE_FAILS: "☒", pb.CHECKLIST_STATE_PENDING: "☐"}
INDENT = " " * 11


class TextRenderer:
    """A run's events as text, in order. A first error already shown in full (a repeat attempt, a ladder step
    reproducing it) is shown again in one line, so the terminal stays readable."""

    def __init__(self, *, logs: bool = False) -> None:
        self.logs = logs
        self._shown: set[str] = set()

    def lines(self, event: pb.RunEvent) -> list[str]:
        """The lines to print for one event; [] for events a reader does not need (heartbeats, logs by default)."""
        kind = event.WhichOneof("payload")
        stamp = event.at.ToDatetime(tzinfo=UTC).strftime("%H:%M:%S")
        if kind == "first_error" and event.first_error.signature in self._shown:
            error = event.first_error
            body = [f"  the same first error again in {to_id(pb.Phase, error.phase)}: {error.line}"]
        else:
            body = _BODY.get(kind or "", _nothing)(getattr(event, kind) if kind else None, self.logs)
        if kind == "first_error":
            self._shown.add(event.first_error.signature)
        if not body:
            return []
        return [f"[{stamp}] {body[0]}", *(f"{INDENT}{line}" for line in body[1:])]


def _nothing(_: Any, __: bool) -> list[str]:
    return []


def _stage_started(m: pb.StageStarted, _: bool) -> list[str]:
    return [f"▶ {to_id(pb.Stage, m.stage)}" + (f" — {m.detail}" if m.detail else "")]


def _stage_finished(m: pb.StageFinished, _: bool) -> list[str]:
    return [f"{STATUS_MARK.get(m.status, '?')} {to_id(pb.Stage, m.stage) or 'run'}: {m.summary}"]


def _phase(m: pb.PhaseReached, _: bool) -> list[str]:
    return [f"  phase {to_id(pb.Phase, m.phase)}"]


def _first_error(m: pb.FirstError, _: bool) -> list[str]:
    lines = [
        f"  FIRST ERROR in {to_id(pb.Phase, m.phase)} [{to_id(pb.ErrorCategory, m.category)}]",
        f"  > {m.line}",
    ]
    lines += [f"  | {line}" for line in m.context]
    lines.append(f"  secondary OOM: {'yes — an OOM was seen, but it is not the cause' if m.secondary_oom else 'no'}")
    if m.hint:
        lines.append(f"  hint: {m.hint}")
    return lines


def _checklist(m: pb.ChecklistItem, _: bool) -> list[str]:
    return [f"  {CHECK_MARK.get(m.state, '?')} {to_id(pb.ChecklistId, m.item)}: {m.evidence}"]


def _ladder(m: pb.LadderStepResult, _: bool) -> list[str]:
    return [f"  ladder {to_id(pb.LadderStepId, m.step)}: {to_id(pb.LadderOutcome, m.outcome)} {m.detail}".rstrip()]


def _log(m: pb.LogChunk, logs: bool) -> list[str]:
    return [f"  log {m.source}:", *(f"  {line}" for line in m.lines)] if logs else []


def _request(m: pb.RequestResult, _: bool) -> list[str]:
    answer = f"HTTP {m.http_status}" if m.http_status else "no answer"
    detail = (
        f"finish {m.finish_reason or '-'}, {m.prompt_tokens} prompt / {m.completion_tokens} completion tokens "
        f"(max_tokens {m.max_tokens}), {m.latency_s:.2f} s"
    )
    line = f"  request #{m.attempt}: {answer}, {detail}{request_notes(m)}" + (f" — {m.error}" if m.error else "")
    return [line, *(f"             warning: {w}" for w in m.warnings)]


def request_notes(m: pb.RequestResult) -> str:
    """What a request result adds besides the answer: GPU memory around it and the warnings logged meanwhile."""
    notes = ""
    if m.gpu_memory_before_mib or m.gpu_memory_after_mib:
        notes += f" · GPU memory {m.gpu_memory_before_mib:,} → {m.gpu_memory_after_mib:,} MiB"
    if m.warnings:
        notes += f" · {len(m.warnings)} warning(s)"
    return notes


def _artifact(m: pb.Artifact, _: bool) -> list[str]:
    if m.media_type == "text/plain" and "\n" not in m.content:
        return [f"  {m.name.replace('_', ' ')}: {m.content}"]
    return [f"  recorded {m.name} ({len(m.content)} bytes; `k3repro show RUN --json` prints it)"]


def _finished(m: pb.RunFinished, _: bool) -> list[str]:
    status = to_id(pb.RunStatus, m.status)
    decision = to_id(pb.Decision, m.decision)
    lines = [f"■ run {status}" + (f" — decision: {decision}" if decision else "")]
    lines += [f"  {m.summary}"] if m.summary else []
    lines += [f"  · {reason}" for reason in m.reasons if reason != m.summary]
    return lines


_BODY: dict[str, Any] = {
    "stage_started": _stage_started,
    "stage_finished": _stage_finished,
    "phase_reached": _phase,
    "first_error": _first_error,
    "checklist_item": _checklist,
    "ladder_step": _ladder,
    "log_chunk": _log,
    "request_result": _request,
    "artifact": _artifact,
    "run_finished": _finished,
}


def run_header(run: dict[str, Any]) -> str:
    return (
        f"run {run['id']} · cluster {run['cluster']} · runner {run['runner']} · image {run['image']} · "
        f"{run['status']}" + (f" · decision {run['decision']}" if run.get("decision") else "")
    )
