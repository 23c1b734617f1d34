"""The run record: the one fold every view of a run reads (first error, repeats, scene, failure, logs)."""

from __future__ import annotations

import json

from bot.record import Check, FirstError, LadderStep, RunRecord, StageResult, fact_of
from bot.report import report
from protos import runner_pb2 as pb

NCCL = pb.FirstError(
    phase=pb.PHASE_GPU_DETECT,
    category=pb.ERROR_CATEGORY_NCCL_COMM,
    line="RuntimeError: NCCL error: unhandled system error",
    signature="nccl unhandled system error",
)


def _events(*payloads: dict[str, object]) -> list[pb.RunEvent]:
    return [pb.RunEvent(run_id="r1", seq=n, **payload) for n, payload in enumerate(payloads, 1)]  # type: ignore[arg-type]


def test_a_stages_first_error_counts_and_an_update_marks_its_oom_secondary() -> None:
    updated = pb.FirstError()
    updated.CopyFrom(NCCL)
    updated.secondary_oom = True
    updated.update = True  # the wire says it restates the first error
    relaunch = pb.FirstError()
    relaunch.CopyFrom(NCCL)
    relaunch.hint = "a relaunch's own hint"
    later = pb.FirstError(phase=pb.PHASE_ENGINE_INIT, category=pb.ERROR_CATEGORY_OOM, line="OOM", signature="oom")
    events = _events(
        {"stage_started": pb.StageStarted(stage=pb.STAGE_MINIMAL_LAUNCH)},
        {"first_error": NCCL},
        {"first_error": later},  # a relaunch's other error: not the stage's first
        {"first_error": updated},  # the analyzer's update of the first one
        {"first_error": relaunch},  # the same line again, not an update: a repeat, the first one stays
        {"stage_started": pb.StageStarted(stage=pb.STAGE_LADDER)},
        {"first_error": later},
    )
    record = RunRecord.replay("r1", events)
    first = record.first_error
    assert first is not None and (first.stage, first.phase, first.category) == (
        "minimal_launch",
        "gpu_detect",
        "nccl_comm",
    )
    assert first.secondary_oom and not first.repeat and first.hint == NCCL.hint  # updated, not replaced by a repeat
    assert record.first_errors["ladder"].signature == "oom" and record.first_errors["ladder"].repeat
    assert report(record)["first_error"] == {
        "phase": "gpu_detect",
        "category": "nccl_comm",
        "line": NCCL.line,
        "signature": NCCL.signature,
        "secondary_oom": True,
        "stacks": [],
    }


def test_ids_are_converted_once_into_facts() -> None:
    step = pb.LadderStepResult(step="prefix_caching", outcome=pb.LADDER_OUTCOME_CRASH, signature="s")
    item = pb.ChecklistItem(item=pb.CHECKLIST_ID_FAILURE_REPEATED, state=pb.CHECKLIST_STATE_HOLDS, evidence="2 of 2")
    assert fact_of(pb.RunEvent(checklist_item=item)) == Check("failure_repeated", "holds", "2 of 2")
    fact = fact_of(pb.RunEvent(ladder_step=step))
    assert isinstance(fact, LadderStep) and (fact.step, fact.outcome, fact.phase) == ("prefix_caching", "crash", "")
    assert fact_of(pb.RunEvent(heartbeat=pb.Heartbeat())) is None
    first = fact_of(pb.RunEvent(first_error=NCCL), "minimal_launch")
    assert isinstance(first, FirstError) and first.stage == "minimal_launch" and not first.repeat


def test_the_scene_is_parsed_once_for_host_image_and_digest() -> None:
    scene = {
        "host": {"hostname": "gpu-a1"},
        "image": {"ref": "vllm/vllm-openai:kimi-k3", "repo_digests": ["vllm/vllm-openai@sha256:" + "ab" * 32]},
    }
    record = RunRecord("r1", image="from-the-row")
    record.apply(
        pb.RunEvent(artifact=pb.Artifact(name="fingerprint", media_type="application/json", content=json.dumps(scene)))
    )
    assert (record.host, record.image, record.digest) == ("gpu-a1", "vllm/vllm-openai:kimi-k3", "sha256:" + "ab" * 32)
    assert record.scene == scene and record.notes == {}  # a file, not a one-line note
    record.apply(
        pb.RunEvent(artifact=pb.Artifact(name="fingerprint", media_type="application/json", content="{not json"))
    )
    assert record.scene == scene  # an unreadable one changes nothing


def test_a_run_without_a_first_error_failed_where_its_first_stage_failed() -> None:
    record = RunRecord.replay(
        "r1",
        _events(
            {"stage_finished": pb.StageFinished(stage=pb.STAGE_FREEZE, status=pb.STAGE_STATUS_OK, summary="ok")},
            {
                "stage_finished": pb.StageFinished(
                    stage=pb.STAGE_BASELINE, status=pb.STAGE_STATUS_FAILED, summary="r575"
                )
            },
            {"log_chunk": pb.LogChunk(source="minimal_launch", lines=["a", "b"])},
            {"log_chunk": pb.LogChunk(source="minimal_launch", lines=["c"])},
            {"run_finished": pb.RunFinished(status=pb.RUN_STATUS_COMPLETED, decision=pb.DECISION_CONTINUE, launches=0)},
        ),
    )
    assert record.failure() == {
        "phase": "baseline",
        "category": "stage_failed",
        "signature": "baseline: r575",
        "line": "r575",
    }
    assert record.steps[1] == StageResult("baseline", "failed", "r575")
    assert record.log_texts() == {"minimal_launch": "a\nb\nc\n"}
    assert (record.status, record.decision, record.final) == ("completed", "continue", True)


def test_the_live_stream_says_what_an_update_changes_instead_of_a_second_first_error() -> None:
    from bot.blocks import EventBlocks
    from bot.rich import mrkdwn_blocks

    updated = pb.FirstError()
    updated.CopyFrom(NCCL)
    updated.secondary_oom, updated.update = True, True
    stream = EventBlocks()
    shown = [
        mrkdwn_blocks(stream.of(event))
        for event in _events(
            {"stage_started": pb.StageStarted(stage=pb.STAGE_MINIMAL_LAUNCH)},
            {"first_error": NCCL},
            {"first_error": updated},
        )
    ]
    assert any(block.get("block_id") == "first_error" for block in shown[1])
    assert len(shown[2]) == 1 and "an out-of-memory error followed it" in json.dumps(shown[2])
    assert "the same first error again" not in json.dumps(shown[2])


def test_an_update_that_comes_in_a_later_stage_updates_the_stage_that_showed_the_error() -> None:
    """A failed engine can outlive its stage: its OOM update then arrives while the next stage runs."""
    updated = pb.FirstError()
    updated.CopyFrom(NCCL)
    updated.secondary_oom, updated.update = True, True
    record = RunRecord.replay(
        "r1",
        _events(
            {"stage_started": pb.StageStarted(stage=pb.STAGE_MINIMAL_LAUNCH)},
            {"first_error": NCCL},
            {"stage_started": pb.StageStarted(stage=pb.STAGE_SINGLE_REQUEST)},
            {"first_error": updated},
        ),
    )
    assert list(record.first_errors) == ["minimal_launch"]
    kept = record.first_errors["minimal_launch"]
    assert kept.secondary_oom and kept.stage == "minimal_launch" and not kept.repeat
