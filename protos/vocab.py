"""The shared vocabulary as stable lower-case ids (e.g. Phase.PHASE_GPU_DETECT <-> "gpu_detect").

Enums are the wire form; ids are what people, JSON and data files use.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from protos import runner_pb2 as pb

E = TypeVar("E", bound=int)

_PREFIXES: dict[str, str] = {
    "Stage": "STAGE_",
    "Phase": "PHASE_",
    "ErrorCategory": "ERROR_CATEGORY_",
    "ChecklistId": "CHECKLIST_ID_",
    "ChecklistState": "CHECKLIST_STATE_",
    "LadderStepId": "LADDER_STEP_ID_",
    "LadderOutcome": "LADDER_OUTCOME_",
    "Decision": "DECISION_",
    "RerunVerdict": "RERUN_VERDICT_",
    "StageStatus": "STAGE_STATUS_",
    "RunStatus": "RUN_STATUS_",
}


def _prefix(enum: Any) -> str:
    return _PREFIXES[enum.DESCRIPTOR.name]


def to_id(enum: type[E], value: int) -> str:
    """Stable id of an enum value; "" for the UNSPECIFIED zero value."""
    if value == 0:
        return ""
    wrapper: Any = enum  # the generated enums are EnumTypeWrapper instances at run time
    return str(wrapper.Name(value)).removeprefix(_prefix(enum)).lower()


def from_id(enum: type[E], ident: str) -> E:
    """Enum value of a stable id; ValueError names the accepted ids."""
    wrapper: Any = enum
    try:
        return cast(E, wrapper.Value(_prefix(enum) + ident.upper()))
    except ValueError:
        name = wrapper.DESCRIPTOR.name
        raise ValueError(f"unknown {name} {ident!r}; expected one of: {', '.join(ids(enum))}") from None


def ids(enum: type[E]) -> list[str]:
    """All ids of an enum in declaration order, without UNSPECIFIED."""
    wrapper: Any = enum
    return [to_id(enum, number) for number in wrapper.values() if number != 0]


PHASES = ids(pb.Phase)
STAGES = ids(pb.Stage)
CATEGORIES = ids(pb.ErrorCategory)
CHECKLIST_IDS = ids(pb.ChecklistId)
LADDER_STEPS = ids(pb.LadderStepId)
