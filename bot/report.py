"""The run report: what a run found, derived from its events (a stable JSON contract)."""

from __future__ import annotations

from typing import Any

from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, to_id


def run_report(run_id: str, events: list[pb.RunEvent]) -> dict[str, Any]:
    """`{"run_id", "decision", "checklist", "first_error", "ladder", "trigger_step", "candidates", "launches"}`."""
    checklist = dict.fromkeys(CHECKLIST_IDS, False)
    first_error: dict[str, Any] | None = None
    ladder: list[dict[str, Any]] = []
    failures: list[pb.LadderStepResult] = []
    finished = pb.RunFinished()
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "checklist_item":
            item = event.checklist_item
            checklist[to_id(pb.ChecklistId, item.item)] = item.state == pb.CHECKLIST_STATE_HOLDS
        elif kind == "first_error" and (first_error is None or first_error["line"] == event.first_error.line):
            error = event.first_error  # a later FirstError with the same line only updates secondary_oom
            first_error = {
                "phase": to_id(pb.Phase, error.phase) or None,
                "category": to_id(pb.ErrorCategory, error.category) or None,
                "line": error.line,
                "signature": error.signature,
                "secondary_oom": error.secondary_oom,
            }
        elif kind == "ladder_step":
            step = event.ladder_step
            ladder.append(
                {
                    "step": to_id(pb.LadderStepId, step.step),
                    "outcome": to_id(pb.LadderOutcome, step.outcome),
                    "relaunched": step.relaunched,
                }
            )
            if step.signature:
                failures.append(step)
        elif kind == "run_finished":
            finished = event.run_finished
    trigger = failures[0] if failures else None
    return {
        "run_id": run_id,
        "decision": to_id(pb.Decision, finished.decision) or None,
        "checklist": checklist,
        "first_error": first_error,
        "ladder": ladder,
        "trigger_step": to_id(pb.LadderStepId, trigger.step) if trigger else None,
        "candidates": [
            {
                "step": to_id(pb.LadderStepId, step.step),
                "phase": to_id(pb.Phase, step.phase) or None,
                "category": to_id(pb.ErrorCategory, step.category) or None,
                "signature": step.signature,
            }
            for step in failures[1:]
            if step.outcome != pb.LADDER_OUTCOME_SAME_AS_TARGET
        ],
        "launches": finished.launches,
    }
