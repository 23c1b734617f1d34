"""The run report: what a run found, as a stable JSON contract (a projection of its record)."""

from __future__ import annotations

import json
from typing import Any

from bot.record import RunRecord
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, ChecklistState, LadderOutcome


def run_report(run_id: str, events: list[pb.RunEvent]) -> dict[str, Any]:
    """`{"run_id", "decision", "verdict_line", "reasons", "baseline", "checklist", "first_error", "ladder",
    "trigger_step", "candidates", "launches", "launch_list", "minimal_failing_command"}` (docs/report.md)."""
    return report(RunRecord.replay(run_id, events))


def _baseline(record: RunRecord) -> dict[str, Any] | None:
    """The baseline's verdict and each rule's status (the full evaluation is in the bundle)."""
    text = record.artifacts.get("baseline")
    if not text:
        return None
    evaluated = json.loads(text)
    rules = {rule["id"]: rule["status"] for rule in evaluated.get("rules", [])}
    return {"profile": evaluated.get("baseline"), "verdict": evaluated.get("verdict"), "rules": rules}


def report(record: RunRecord) -> dict[str, Any]:
    error, failures = record.first_error, [step for step in record.ladder if step.signature]
    minimized = record.artifacts.get("minimal_failing_command")
    checks = {item: {"state": check.state, "evidence": check.evidence} for item, check in record.checklist.items()}
    no_evidence = {"state": ChecklistState.PENDING, "evidence": ""}
    return {
        "run_id": record.run_id,
        "decision": record.decision or None,
        # the verdict as one line (cause, evidence, next action), then the decision's reasons
        "verdict_line": record.finished.headline or None if record.finished is not None else None,
        "reasons": list(record.finished.reasons) if record.finished is not None else [],
        "baseline": _baseline(record),
        # each item: holds / fails / pending (no evidence) / not_applicable, and the evidence for it
        "checklist": {item: checks.get(item, no_evidence) for item in CHECKLIST_IDS},
        "first_error": None
        if error is None
        else {
            "phase": error.phase or None,
            "category": error.category or None,
            "line": error.line,
            "signature": error.signature,
            "secondary_oom": error.secondary_oom,
            # a hang: where the engine's processes waited (py-spy), the headline first; [] otherwise
            "stacks": list(error.stacks),
        },
        "ladder": [{"step": s.step, "outcome": s.outcome, "relaunched": s.relaunched} for s in record.ladder],
        "trigger_step": record.trigger.step if record.trigger else None,
        "candidates": [
            {"step": s.step, "phase": s.phase or None, "category": s.category or None, "signature": s.signature}
            for s in failures[1:]
            if s.outcome != LadderOutcome.SAME_AS_TARGET
        ],
        "launches": record.finished.launches if record.finished is not None else 0,
        # each launch: its log source, its stage, the proxies it ran on (null: the real configuration), its failure
        "launch_list": [
            {
                "source": span.source,
                "stage": span.stage,
                "proxy": {"proxies": [p for p, _ in span.proxies], "removes": [r for _, r in span.proxies]}
                if span.proxy
                else None,
                "failed": {"phase": span.failure[1], "category": span.failure[2]} if span.failure else None,
            }
            for span in record.launches
        ],
        # a minimize run's result: the 1-minimal failing command, the flags shown irrelevant, every test
        "minimal_failing_command": json.loads(minimized) if minimized else None,
    }
