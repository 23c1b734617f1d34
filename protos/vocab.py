"""The shared vocabulary as stable lower-case ids (e.g. Phase.PHASE_GPU_DETECT <-> "gpu_detect").

Enums are the wire form; ids are what people, JSON and data files use.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar, cast

from protos import runner_pb2 as pb

E = TypeVar("E", bound=int)

_PREFIXES: dict[str, str] = {
    "Stage": "STAGE_",
    "Phase": "PHASE_",
    "ErrorCategory": "ERROR_CATEGORY_",
    "ChecklistId": "CHECKLIST_ID_",
    "ChecklistState": "CHECKLIST_STATE_",
    "LadderOutcome": "LADDER_OUTCOME_",
    "Decision": "DECISION_",
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


# The status and verdict vocabularies, one StrEnum each: a member is its proto enum's id, so the store, JSON and
# data files hold the same strings as before, and code compares and keys by member (tests/test_vocab.py keeps
# each equal to its proto enum). `member` reads one from the wire (None: left unset); `wire` writes it back.


class StageStatus(StrEnum):
    """How a stage ended (pb.StageStatus): failed means it found the failure it looks for, or could not run."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class RunStatus(StrEnum):
    """How a run itself ended, not what it found (pb.RunStatus)."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    ERROR = "error"


class Decision(StrEnum):
    """The verdict's next action (pb.Decision)."""

    FIX = "fix"
    ISOLATE = "isolate"
    CONTINUE = "continue"


class LadderOutcome(StrEnum):
    """What one ladder step found (pb.LadderOutcome)."""

    OK = "ok"
    CACHE_HIT = "cache_hit"
    CACHE_MISS = "cache_miss"
    OOM = "oom"
    COMM_ERROR = "comm_error"
    CRASH = "crash"
    SAME_AS_TARGET = "same_as_target"
    NOT_APPLICABLE = "not_applicable"
    PROBE_ERROR = "probe_error"


class ChecklistState(StrEnum):
    """Where one checklist item stands (pb.ChecklistState): pending until a stage has evidence."""

    PENDING = "pending"
    HOLDS = "holds"
    FAILS = "fails"
    NOT_APPLICABLE = "not_applicable"


# Each vocabulary's proto enum.
WIRE: dict[type[StrEnum], Any] = {
    StageStatus: pb.StageStatus,
    RunStatus: pb.RunStatus,
    Decision: pb.Decision,
    LadderOutcome: pb.LadderOutcome,
    ChecklistState: pb.ChecklistState,
}

V = TypeVar("V", bound=StrEnum)


def member(kind: type[V], value: int) -> V | None:
    """The member a wire value stands for; None for UNSPECIFIED (the sender left it unset), ValueError for a
    value the proto does not have."""
    ident = to_id(WIRE[kind], value)
    return kind(ident) if ident else None


# The fixed request: the APIs it may use, each by its path on the server, and what it is when nothing is said
# (a cluster's [request] without api or repeats; a StartRun's api "" and repeats 0 on the wire).
API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
DEFAULT_API = "chat"
DEFAULT_REPEATS = 3

# The phase of an error nothing in its log places: an id of the vocabulary, but no phase a launch goes through.
UNKNOWN_PHASE = "unknown"
PHASES = [phase for phase in ids(pb.Phase) if phase != UNKNOWN_PHASE]  # a launch's phases, in order
STAGES = ids(pb.Stage)
CATEGORIES = ids(pb.ErrorCategory)


@dataclass(frozen=True)
class ChecklistItem:
    """One item of the method's checklist: the stages that may settle it (the first owns it) and its evidence."""

    id: str
    stages: tuple[str, ...]
    evidence: str


# The checklist, in the proto's order (ChecklistId holds the wire numbers; a test keeps the two equal).
CHECKLIST = (
    ChecklistItem("host_driver_recorded", ("freeze",), "host driver and CUDA driver versions, as NVML reports them"),
    ChecklistItem("container_gpu_view_recorded", ("freeze",), "the GPUs and libraries the container sees"),
    ChecklistItem("image_and_versions_pinned", ("freeze",), "image digest; vLLM, PyTorch, CUDA, NCCL as loaded in it"),
    ChecklistItem("minimal_command_one_line", ("minimal_launch",), "the minimal launch command, one line"),
    ChecklistItem(
        "first_error_saved",
        ("minimal_launch", "single_request", "verdict"),
        "the first error's phase, category and line (or why there is none)",
    ),
    ChecklistItem("single_request_fixed", ("single_request",), "the same fixed request, answered alike each time"),
    ChecklistItem("prefix_caching_isolated", ("verdict",), "the prefix-caching step's outcome on its own"),
    ChecklistItem("oom_not_secondary", ("verdict",), "an OOM is the cause, not a later symptom or leftover memory"),
    ChecklistItem("revertible_baseline", ("verdict",), "the last stable launch command, to go back to"),
    ChecklistItem("failure_repeated", ("verdict",), "the same failure at the same phase on each attempt"),
    ChecklistItem(
        "caches_not_stale",
        ("minimal_launch", "verdict"),
        "one control launch with fresh, empty caches fails the same way (not applicable when none was needed)",
    ),
)
CHECKLIST_IDS = [item.id for item in CHECKLIST]
