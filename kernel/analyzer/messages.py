"""An analyzer finding as the contract's FirstError message (runner events and the bot's start request)."""

from __future__ import annotations

from kernel.analyzer.stream import ErrorFinding
from protos import runner_pb2 as pb
from protos.vocab import from_id


def first_error_message(finding: ErrorFinding) -> pb.FirstError:
    return pb.FirstError(
        phase=from_id(pb.Phase, finding.phase) if finding.phase else pb.PHASE_UNSPECIFIED,  # "unknown" included
        category=from_id(pb.ErrorCategory, finding.category),
        line=finding.line,
        context=list(finding.context),
        secondary_oom=finding.secondary_oom,
        signature=finding.signature,
        hint=finding.hint,
    )
