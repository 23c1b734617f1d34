import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_UNSPECIFIED: _ClassVar[Stage]
    STAGE_FREEZE: _ClassVar[Stage]
    STAGE_BASELINE: _ClassVar[Stage]
    STAGE_MINIMAL_LAUNCH: _ClassVar[Stage]
    STAGE_SINGLE_REQUEST: _ClassVar[Stage]
    STAGE_LADDER: _ClassVar[Stage]
    STAGE_VERDICT: _ClassVar[Stage]
    STAGE_MINIMIZE: _ClassVar[Stage]

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_CONTAINER_INIT: _ClassVar[Phase]
    PHASE_GPU_DETECT: _ClassVar[Phase]
    PHASE_WEIGHT_LOAD: _ClassVar[Phase]
    PHASE_ENGINE_INIT: _ClassVar[Phase]
    PHASE_API_LISTEN: _ClassVar[Phase]
    PHASE_REQUEST: _ClassVar[Phase]
    PHASE_UNKNOWN: _ClassVar[Phase]

class ErrorCategory(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CATEGORY_UNSPECIFIED: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_DRIVER_CUDA_INIT: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_PTX_TOOLCHAIN: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_NCCL_COMM: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_OOM: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_CUDAGRAPH: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_KV_CACHE_CAPACITY: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_WEIGHT_LOAD: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_MODEL_CONFIG: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_COMPILE: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_PORT_IN_USE: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_REQUEST_ERROR: _ClassVar[ErrorCategory]
    ERROR_CATEGORY_OTHER: _ClassVar[ErrorCategory]

class ChecklistId(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKLIST_ID_UNSPECIFIED: _ClassVar[ChecklistId]
    CHECKLIST_ID_HOST_DRIVER_RECORDED: _ClassVar[ChecklistId]
    CHECKLIST_ID_CONTAINER_GPU_VIEW_RECORDED: _ClassVar[ChecklistId]
    CHECKLIST_ID_IMAGE_AND_VERSIONS_PINNED: _ClassVar[ChecklistId]
    CHECKLIST_ID_MINIMAL_COMMAND_ONE_LINE: _ClassVar[ChecklistId]
    CHECKLIST_ID_FIRST_ERROR_SAVED: _ClassVar[ChecklistId]
    CHECKLIST_ID_SINGLE_REQUEST_FIXED: _ClassVar[ChecklistId]
    CHECKLIST_ID_PREFIX_CACHING_ISOLATED: _ClassVar[ChecklistId]
    CHECKLIST_ID_OOM_NOT_SECONDARY: _ClassVar[ChecklistId]
    CHECKLIST_ID_REVERTIBLE_BASELINE: _ClassVar[ChecklistId]
    CHECKLIST_ID_FAILURE_REPEATED: _ClassVar[ChecklistId]
    CHECKLIST_ID_CACHES_NOT_STALE: _ClassVar[ChecklistId]

class ChecklistState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKLIST_STATE_UNSPECIFIED: _ClassVar[ChecklistState]
    CHECKLIST_STATE_PENDING: _ClassVar[ChecklistState]
    CHECKLIST_STATE_HOLDS: _ClassVar[ChecklistState]
    CHECKLIST_STATE_FAILS: _ClassVar[ChecklistState]
    CHECKLIST_STATE_NOT_APPLICABLE: _ClassVar[ChecklistState]

class LadderOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LADDER_OUTCOME_UNSPECIFIED: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_OK: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_CACHE_HIT: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_CACHE_MISS: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_OOM: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_COMM_ERROR: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_CRASH: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_SAME_AS_TARGET: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_NOT_APPLICABLE: _ClassVar[LadderOutcome]
    LADDER_OUTCOME_PROBE_ERROR: _ClassVar[LadderOutcome]

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    DECISION_FIX: _ClassVar[Decision]
    DECISION_ISOLATE: _ClassVar[Decision]
    DECISION_CONTINUE: _ClassVar[Decision]

class StageStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STAGE_STATUS_UNSPECIFIED: _ClassVar[StageStatus]
    STAGE_STATUS_OK: _ClassVar[StageStatus]
    STAGE_STATUS_FAILED: _ClassVar[StageStatus]
    STAGE_STATUS_SKIPPED: _ClassVar[StageStatus]
    STAGE_STATUS_CANCELLED: _ClassVar[StageStatus]

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]
    RUN_STATUS_ERROR: _ClassVar[RunStatus]
STAGE_UNSPECIFIED: Stage
STAGE_FREEZE: Stage
STAGE_BASELINE: Stage
STAGE_MINIMAL_LAUNCH: Stage
STAGE_SINGLE_REQUEST: Stage
STAGE_LADDER: Stage
STAGE_VERDICT: Stage
STAGE_MINIMIZE: Stage
PHASE_UNSPECIFIED: Phase
PHASE_CONTAINER_INIT: Phase
PHASE_GPU_DETECT: Phase
PHASE_WEIGHT_LOAD: Phase
PHASE_ENGINE_INIT: Phase
PHASE_API_LISTEN: Phase
PHASE_REQUEST: Phase
PHASE_UNKNOWN: Phase
ERROR_CATEGORY_UNSPECIFIED: ErrorCategory
ERROR_CATEGORY_DRIVER_CUDA_INIT: ErrorCategory
ERROR_CATEGORY_PTX_TOOLCHAIN: ErrorCategory
ERROR_CATEGORY_NCCL_COMM: ErrorCategory
ERROR_CATEGORY_OOM: ErrorCategory
ERROR_CATEGORY_CUDAGRAPH: ErrorCategory
ERROR_CATEGORY_KV_CACHE_CAPACITY: ErrorCategory
ERROR_CATEGORY_WEIGHT_LOAD: ErrorCategory
ERROR_CATEGORY_MODEL_CONFIG: ErrorCategory
ERROR_CATEGORY_COMPILE: ErrorCategory
ERROR_CATEGORY_PORT_IN_USE: ErrorCategory
ERROR_CATEGORY_REQUEST_ERROR: ErrorCategory
ERROR_CATEGORY_OTHER: ErrorCategory
CHECKLIST_ID_UNSPECIFIED: ChecklistId
CHECKLIST_ID_HOST_DRIVER_RECORDED: ChecklistId
CHECKLIST_ID_CONTAINER_GPU_VIEW_RECORDED: ChecklistId
CHECKLIST_ID_IMAGE_AND_VERSIONS_PINNED: ChecklistId
CHECKLIST_ID_MINIMAL_COMMAND_ONE_LINE: ChecklistId
CHECKLIST_ID_FIRST_ERROR_SAVED: ChecklistId
CHECKLIST_ID_SINGLE_REQUEST_FIXED: ChecklistId
CHECKLIST_ID_PREFIX_CACHING_ISOLATED: ChecklistId
CHECKLIST_ID_OOM_NOT_SECONDARY: ChecklistId
CHECKLIST_ID_REVERTIBLE_BASELINE: ChecklistId
CHECKLIST_ID_FAILURE_REPEATED: ChecklistId
CHECKLIST_ID_CACHES_NOT_STALE: ChecklistId
CHECKLIST_STATE_UNSPECIFIED: ChecklistState
CHECKLIST_STATE_PENDING: ChecklistState
CHECKLIST_STATE_HOLDS: ChecklistState
CHECKLIST_STATE_FAILS: ChecklistState
CHECKLIST_STATE_NOT_APPLICABLE: ChecklistState
LADDER_OUTCOME_UNSPECIFIED: LadderOutcome
LADDER_OUTCOME_OK: LadderOutcome
LADDER_OUTCOME_CACHE_HIT: LadderOutcome
LADDER_OUTCOME_CACHE_MISS: LadderOutcome
LADDER_OUTCOME_OOM: LadderOutcome
LADDER_OUTCOME_COMM_ERROR: LadderOutcome
LADDER_OUTCOME_CRASH: LadderOutcome
LADDER_OUTCOME_SAME_AS_TARGET: LadderOutcome
LADDER_OUTCOME_NOT_APPLICABLE: LadderOutcome
LADDER_OUTCOME_PROBE_ERROR: LadderOutcome
DECISION_UNSPECIFIED: Decision
DECISION_FIX: Decision
DECISION_ISOLATE: Decision
DECISION_CONTINUE: Decision
STAGE_STATUS_UNSPECIFIED: StageStatus
STAGE_STATUS_OK: StageStatus
STAGE_STATUS_FAILED: StageStatus
STAGE_STATUS_SKIPPED: StageStatus
STAGE_STATUS_CANCELLED: StageStatus
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_CANCELLED: RunStatus
RUN_STATUS_ERROR: RunStatus

class FixedRequest(_message.Message):
    __slots__ = ("api", "body_json", "repeats")
    API_FIELD_NUMBER: _ClassVar[int]
    BODY_JSON_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    api: str
    body_json: str
    repeats: int
    def __init__(self, api: _Optional[str] = ..., body_json: _Optional[str] = ..., repeats: _Optional[int] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("at", "what", "by")
    AT_FIELD_NUMBER: _ClassVar[int]
    WHAT_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    at: str
    what: str
    by: str
    def __init__(self, at: _Optional[str] = ..., what: _Optional[str] = ..., by: _Optional[str] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ("run_id", "cluster", "image", "launch_argv", "request", "profile", "requested_by", "changes", "rerun", "deployment_error", "minimize")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_ARGV_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    RERUN_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_ERROR_FIELD_NUMBER: _ClassVar[int]
    MINIMIZE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    cluster: str
    image: str
    launch_argv: _containers.RepeatedScalarFieldContainer[str]
    request: FixedRequest
    profile: str
    requested_by: str
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    rerun: Rerun
    deployment_error: FirstError
    minimize: Minimize
    def __init__(self, run_id: _Optional[str] = ..., cluster: _Optional[str] = ..., image: _Optional[str] = ..., launch_argv: _Optional[_Iterable[str]] = ..., request: _Optional[_Union[FixedRequest, _Mapping]] = ..., profile: _Optional[str] = ..., requested_by: _Optional[str] = ..., changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., rerun: _Optional[_Union[Rerun, _Mapping]] = ..., deployment_error: _Optional[_Union[FirstError, _Mapping]] = ..., minimize: _Optional[_Union[Minimize, _Mapping]] = ...) -> None: ...

class Minimize(_message.Message):
    __slots__ = ("original_run_id", "step", "phase", "category", "signature")
    ORIGINAL_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    original_run_id: str
    step: str
    phase: Phase
    category: ErrorCategory
    signature: str
    def __init__(self, original_run_id: _Optional[str] = ..., step: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., category: _Optional[_Union[ErrorCategory, str]] = ..., signature: _Optional[str] = ...) -> None: ...

class Rerun(_message.Message):
    __slots__ = ("original_run_id", "bundle_sha256", "image_digest")
    ORIGINAL_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_SHA256_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    original_run_id: str
    bundle_sha256: str
    image_digest: str
    def __init__(self, original_run_id: _Optional[str] = ..., bundle_sha256: _Optional[str] = ..., image_digest: _Optional[str] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ("run_id", "after_seq")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_seq: int
    def __init__(self, run_id: _Optional[str] = ..., after_seq: _Optional[int] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason", "requested_by")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    requested_by: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ..., requested_by: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("cancelled", "message")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    message: str
    def __init__(self, cancelled: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunnerDescription(_message.Message):
    __slots__ = ("name", "cluster", "labels", "hostname", "backend", "active_run_ids", "max_concurrent_runs", "version", "allowed_images")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_RUNS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_IMAGES_FIELD_NUMBER: _ClassVar[int]
    name: str
    cluster: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    hostname: str
    backend: str
    active_run_ids: _containers.RepeatedScalarFieldContainer[str]
    max_concurrent_runs: int
    version: str
    allowed_images: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., cluster: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., hostname: _Optional[str] = ..., backend: _Optional[str] = ..., active_run_ids: _Optional[_Iterable[str]] = ..., max_concurrent_runs: _Optional[int] = ..., version: _Optional[str] = ..., allowed_images: _Optional[_Iterable[str]] = ...) -> None: ...

class StageStarted(_message.Message):
    __slots__ = ("stage", "detail")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    stage: Stage
    detail: str
    def __init__(self, stage: _Optional[_Union[Stage, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class StageFinished(_message.Message):
    __slots__ = ("stage", "status", "summary")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    stage: Stage
    status: StageStatus
    summary: str
    def __init__(self, stage: _Optional[_Union[Stage, str]] = ..., status: _Optional[_Union[StageStatus, str]] = ..., summary: _Optional[str] = ...) -> None: ...

class PhaseReached(_message.Message):
    __slots__ = ("phase", "line")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    line: str
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., line: _Optional[str] = ...) -> None: ...

class FirstError(_message.Message):
    __slots__ = ("phase", "category", "line", "context", "secondary_oom", "signature", "hint", "stacks", "update")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_OOM_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    category: ErrorCategory
    line: str
    context: _containers.RepeatedScalarFieldContainer[str]
    secondary_oom: bool
    signature: str
    hint: str
    stacks: _containers.RepeatedScalarFieldContainer[str]
    update: bool
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., category: _Optional[_Union[ErrorCategory, str]] = ..., line: _Optional[str] = ..., context: _Optional[_Iterable[str]] = ..., secondary_oom: _Optional[bool] = ..., signature: _Optional[str] = ..., hint: _Optional[str] = ..., stacks: _Optional[_Iterable[str]] = ..., update: _Optional[bool] = ...) -> None: ...

class ChecklistItem(_message.Message):
    __slots__ = ("item", "state", "evidence")
    ITEM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    item: ChecklistId
    state: ChecklistState
    evidence: str
    def __init__(self, item: _Optional[_Union[ChecklistId, str]] = ..., state: _Optional[_Union[ChecklistState, str]] = ..., evidence: _Optional[str] = ...) -> None: ...

class LadderStepResult(_message.Message):
    __slots__ = ("step", "outcome", "detail", "relaunched", "signature", "phase", "category", "title", "added", "as_written")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    RELAUNCHED_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    AS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    step: str
    outcome: LadderOutcome
    detail: str
    relaunched: bool
    signature: str
    phase: Phase
    category: ErrorCategory
    title: str
    added: _containers.RepeatedScalarFieldContainer[str]
    as_written: bool
    def __init__(self, step: _Optional[str] = ..., outcome: _Optional[_Union[LadderOutcome, str]] = ..., detail: _Optional[str] = ..., relaunched: _Optional[bool] = ..., signature: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., category: _Optional[_Union[ErrorCategory, str]] = ..., title: _Optional[str] = ..., added: _Optional[_Iterable[str]] = ..., as_written: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("source", "lines")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    source: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, source: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class RequestResult(_message.Message):
    __slots__ = ("attempt", "http_status", "finish_reason", "prompt_tokens", "completion_tokens", "max_tokens", "latency_s", "error", "gpu_memory_before_mib", "gpu_memory_after_mib", "warnings")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BEFORE_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_AFTER_MIB_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    http_status: int
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int
    latency_s: float
    error: str
    gpu_memory_before_mib: int
    gpu_memory_after_mib: int
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, attempt: _Optional[int] = ..., http_status: _Optional[int] = ..., finish_reason: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., latency_s: _Optional[float] = ..., error: _Optional[str] = ..., gpu_memory_before_mib: _Optional[int] = ..., gpu_memory_after_mib: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class Artifact(_message.Message):
    __slots__ = ("name", "media_type", "content")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    media_type: str
    content: str
    def __init__(self, name: _Optional[str] = ..., media_type: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class LaunchStarted(_message.Message):
    __slots__ = ("source", "line", "proxies", "number")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    source: str
    line: str
    proxies: _containers.RepeatedCompositeFieldContainer[ProxyUsed]
    number: int
    def __init__(self, source: _Optional[str] = ..., line: _Optional[str] = ..., proxies: _Optional[_Iterable[_Union[ProxyUsed, _Mapping]]] = ..., number: _Optional[int] = ...) -> None: ...

class ProxyUsed(_message.Message):
    __slots__ = ("id", "removes")
    ID_FIELD_NUMBER: _ClassVar[int]
    REMOVES_FIELD_NUMBER: _ClassVar[int]
    id: str
    removes: str
    def __init__(self, id: _Optional[str] = ..., removes: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("last_seq", "stage")
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    last_seq: int
    stage: Stage
    def __init__(self, last_seq: _Optional[int] = ..., stage: _Optional[_Union[Stage, str]] = ...) -> None: ...

class RunFinished(_message.Message):
    __slots__ = ("status", "decision", "reasons", "summary", "launches", "headline")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    LAUNCHES_FIELD_NUMBER: _ClassVar[int]
    HEADLINE_FIELD_NUMBER: _ClassVar[int]
    status: RunStatus
    decision: Decision
    reasons: _containers.RepeatedScalarFieldContainer[str]
    summary: str
    launches: int
    headline: str
    def __init__(self, status: _Optional[_Union[RunStatus, str]] = ..., decision: _Optional[_Union[Decision, str]] = ..., reasons: _Optional[_Iterable[str]] = ..., summary: _Optional[str] = ..., launches: _Optional[int] = ..., headline: _Optional[str] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("run_id", "seq", "at", "stage_started", "stage_finished", "phase_reached", "first_error", "checklist_item", "ladder_step", "log_chunk", "request_result", "artifact", "heartbeat", "run_finished", "launch_started")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    STAGE_STARTED_FIELD_NUMBER: _ClassVar[int]
    STAGE_FINISHED_FIELD_NUMBER: _ClassVar[int]
    PHASE_REACHED_FIELD_NUMBER: _ClassVar[int]
    FIRST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECKLIST_ITEM_FIELD_NUMBER: _ClassVar[int]
    LADDER_STEP_FIELD_NUMBER: _ClassVar[int]
    LOG_CHUNK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RESULT_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    RUN_FINISHED_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_STARTED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: int
    at: _timestamp_pb2.Timestamp
    stage_started: StageStarted
    stage_finished: StageFinished
    phase_reached: PhaseReached
    first_error: FirstError
    checklist_item: ChecklistItem
    ladder_step: LadderStepResult
    log_chunk: LogChunk
    request_result: RequestResult
    artifact: Artifact
    heartbeat: Heartbeat
    run_finished: RunFinished
    launch_started: LaunchStarted
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stage_started: _Optional[_Union[StageStarted, _Mapping]] = ..., stage_finished: _Optional[_Union[StageFinished, _Mapping]] = ..., phase_reached: _Optional[_Union[PhaseReached, _Mapping]] = ..., first_error: _Optional[_Union[FirstError, _Mapping]] = ..., checklist_item: _Optional[_Union[ChecklistItem, _Mapping]] = ..., ladder_step: _Optional[_Union[LadderStepResult, _Mapping]] = ..., log_chunk: _Optional[_Union[LogChunk, _Mapping]] = ..., request_result: _Optional[_Union[RequestResult, _Mapping]] = ..., artifact: _Optional[_Union[Artifact, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., run_finished: _Optional[_Union[RunFinished, _Mapping]] = ..., launch_started: _Optional[_Union[LaunchStarted, _Mapping]] = ...) -> None: ...
