"""What a run's Slack thread shows, as a fold over its events: the same events give the same view.

That is what lets a restarted bot rebuild a thread's state from the store and carry on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from protos import runner_pb2 as pb
from protos.vocab import to_id

FINAL_STATUSES = ("completed", "cancelled", "error", "lost")


@dataclass
class RunView:
    run_id: str
    cluster: str
    runner: str
    image: str
    requested_by: str
    status: str = "running"
    stage: str = ""
    phase: str = ""
    host: str = ""
    digest: str = ""
    problem: str = ""  # why the bot stopped following (lost, refused)
    checklist: dict[str, tuple[int, str]] = field(default_factory=dict)  # item id -> (state, evidence)
    first_errors: dict[str, pb.FirstError] = field(default_factory=dict)  # by stage
    notes: dict[str, list[pb.Artifact]] = field(default_factory=dict)  # one-line artifacts, by stage
    requests: list[pb.RequestResult] = field(default_factory=list)
    finished: pb.RunFinished | None = None

    @classmethod
    def of(cls, run: dict[str, Any]) -> RunView:
        view = cls(run["id"], run["cluster"], run["runner"] or "", run["image"] or "", run["requested_by"] or "")
        if run["status"] in FINAL_STATUSES:
            view.status, view.problem = run["status"], run["summary"] or ""
        return view

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def decision(self) -> str:
        return to_id(pb.Decision, self.finished.decision) if self.finished is not None else ""

    def apply(self, event: pb.RunEvent) -> None:
        kind = event.WhichOneof("payload")
        if kind == "stage_started":
            self.stage, self.phase = to_id(pb.Stage, event.stage_started.stage), ""
        elif kind == "phase_reached":
            self.phase = to_id(pb.Phase, event.phase_reached.phase)
        elif kind == "checklist_item":
            item = event.checklist_item
            self.checklist[to_id(pb.ChecklistId, item.item)] = (item.state, item.evidence)
        elif kind == "first_error":  # a stage's first error is the one that counts; relaunches repeat it
            self.first_errors.setdefault(self.stage, event.first_error)
        elif kind == "request_result":
            self.requests.append(event.request_result)
        elif kind == "artifact" and is_file(event.artifact):
            self._fingerprint(event.artifact)
        elif kind == "artifact":
            self.notes.setdefault(self.stage, []).append(event.artifact)
        elif kind == "run_finished":
            self.finished = event.run_finished
            self.status, self.stage, self.phase = to_id(pb.RunStatus, event.run_finished.status), "", ""

    def _fingerprint(self, artifact: pb.Artifact) -> None:
        if artifact.name != "fingerprint":
            return
        try:
            data = json.loads(artifact.content)
        except ValueError:
            return
        host, image = data.get("host") or {}, data.get("image") or {}
        self.host = str(host.get("hostname") or self.host) if isinstance(host, dict) else self.host
        if isinstance(image, dict):
            self.image = str(image.get("ref") or self.image)
            digests = [str(ref) for ref in image.get("repo_digests") or [] if "@" in str(ref)]
            pinned = [self.image] if "@" in self.image else []
            self.digest = next((ref.partition("@")[2] for ref in pinned + digests), self.digest)

    def lost(self, status: str, problem: str) -> None:
        self.status, self.problem = status, problem


def is_file(artifact: pb.Artifact) -> bool:
    """Structured or multi-line evidence goes to a file; a one-liner is shown in the stage's message."""
    return artifact.media_type != "text/plain" or "\n" in artifact.content
