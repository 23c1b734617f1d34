"""What the stages of one run share."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from protos import runner_pb2 as pb
from runner.config import RunnerConfig
from runner.engines import EngineBackend, RunningEngine
from runner.vllm_cli import ServeCommand

Emit = Callable[..., Awaitable[pb.RunEvent]]


@dataclass
class StageResult:
    status: pb.StageStatus
    summary: str


@dataclass
class RunContext:
    run_id: str
    request: pb.StartRunRequest
    command: ServeCommand
    config: RunnerConfig
    backend: EngineBackend
    emit: Emit
    stage: pb.Stage = pb.STAGE_UNSPECIFIED
    engine: RunningEngine | None = None
    base_url: str = ""
    checklist: dict[pb.ChecklistId, tuple[pb.ChecklistState, str]] = field(default_factory=dict)
    follower: Any = None  # the LogFollower of the live engine, set by minimal_launch

    async def check(self, item: pb.ChecklistId, state: pb.ChecklistState, evidence: str) -> None:
        """Records a checklist item once it has evidence (or changes), as an event."""
        if self.checklist.get(item) == (state, evidence):
            return
        self.checklist[item] = (state, evidence)
        await self.emit(checklist_item=pb.ChecklistItem(item=item, state=state, evidence=evidence))

    async def artifact(self, name: str, content: Any) -> None:
        if isinstance(content, str):
            await self.emit(artifact=pb.Artifact(name=name, media_type="text/plain", content=content))
        else:
            text = json.dumps(content, indent=2, sort_keys=True)
            await self.emit(artifact=pb.Artifact(name=name, media_type="application/json", content=text))
