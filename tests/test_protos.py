from __future__ import annotations

from pathlib import Path

import pytest

from bot.record import Check, Finished, LadderStep, StageResult, fact_of
from kernel.vllm_cli import ladder_step_ids
from protos import runner_pb2 as pb
from protos import vocab
from protos.generate import OUTPUTS, ROOT, generate


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    generate(tmp_path)
    for name in OUTPUTS:
        fresh = (tmp_path / "protos" / name).read_text()
        checked_in = (ROOT / "protos" / name).read_text()
        assert fresh == checked_in, f"protos/{name} drifted from runner.proto: run `python -m protos.generate`"


def test_vocabulary_is_the_designs() -> None:
    assert vocab.PHASES == ["container_init", "gpu_detect", "weight_load", "engine_init", "api_listen", "request"]
    assert vocab.STAGES == ["freeze", "baseline", "minimal_launch", "single_request", "ladder", "verdict", "minimize"]
    assert vocab.CATEGORIES == [
        "driver_cuda_init", "ptx_toolchain", "nccl_comm", "oom", "cudagraph", "kv_cache_capacity",
        "weight_load", "model_config", "compile", "port_in_use", "request_error", "other",
    ]  # fmt: skip
    assert ladder_step_ids() == (  # kernel/data/ladder.toml, DESIGN §1 step 5's order
        "prefix_caching", "long_input", "max_model_len", "concurrency", "inter_node", "tools_structured_output",
        "speculative_decoding", "kernel_backends", "compilation_cuda_graphs", "kv_transfer", "lora_multimodal",
        "server_options", "as_written",
    )  # fmt: skip
    assert vocab.CHECKLIST_IDS == [
        "host_driver_recorded", "container_gpu_view_recorded", "image_and_versions_pinned",
        "minimal_command_one_line", "first_error_saved", "single_request_fixed", "prefix_caching_isolated",
        "oom_not_secondary", "revertible_baseline", "failure_repeated", "caches_not_stale",
    ]  # fmt: skip
    assert vocab.ids(pb.ChecklistId) == vocab.CHECKLIST_IDS  # the table and the wire enum agree
    assert all(item.stages and set(item.stages) <= set(vocab.STAGES) and item.evidence for item in vocab.CHECKLIST)
    assert vocab.ids(pb.Decision) == ["fix", "isolate", "continue"]


def test_ids_round_trip_and_unknown_ids_are_named() -> None:
    for phase in vocab.PHASES:
        assert vocab.to_id(pb.Phase, vocab.from_id(pb.Phase, phase)) == phase
    assert vocab.to_id(pb.Phase, pb.PHASE_UNSPECIFIED) == ""
    with pytest.raises(ValueError, match="unknown Phase 'warmup'; expected one of: container_init"):
        vocab.from_id(pb.Phase, "warmup")


def test_each_status_and_verdict_enum_is_its_proto_enums_ids() -> None:
    names = {wire.DESCRIPTOR.name for wire in vocab.WIRE.values()}
    # every status, verdict and outcome enum of the wire has its Python enum
    assert names == {"StageStatus", "RunStatus", "Decision", "LadderOutcome", "ChecklistState"}
    for kind, wire in vocab.WIRE.items():
        assert [m.value for m in kind] == vocab.ids(wire), kind.__name__  # same ids, same order
        assert [m.name for m in kind] == [vocab.to_id(wire, n).upper() for n in wire.values() if n], kind.__name__
        for item in kind:
            assert vocab.member(kind, vocab.from_id(wire, item.value)) is item
    assert vocab.member(vocab.Decision, pb.DECISION_UNSPECIFIED) is None
    with pytest.raises(ValueError, match="RunStatus has no name defined for value 99"):
        vocab.member(vocab.RunStatus, 99)  # a value a newer proto has


def test_the_record_holds_members_and_none_where_the_wire_left_a_value_unset() -> None:
    finished = fact_of(pb.RunEvent(run_finished=pb.RunFinished(status=pb.RUN_STATUS_ERROR)))
    assert isinstance(finished, Finished) and finished.status is vocab.RunStatus.ERROR and finished.decision is None
    step = fact_of(pb.RunEvent(ladder_step=pb.LadderStepResult(outcome=pb.LADDER_OUTCOME_CACHE_MISS)))
    assert isinstance(step, LadderStep) and step.outcome is vocab.LadderOutcome.CACHE_MISS
    unset = fact_of(pb.RunEvent(stage_finished=pb.StageFinished(stage=pb.STAGE_FREEZE)))
    assert isinstance(unset, StageResult) and unset.status is None
    check = fact_of(pb.RunEvent(checklist_item=pb.ChecklistItem(item=pb.CHECKLIST_ID_FAILURE_REPEATED)))
    assert isinstance(check, Check) and check.state is vocab.ChecklistState.PENDING  # unset: no evidence


def test_every_event_payload_is_in_the_oneof() -> None:
    names = {field.name for field in pb.RunEvent.DESCRIPTOR.oneofs_by_name["payload"].fields}
    assert names == {
        "stage_started", "stage_finished", "phase_reached", "first_error", "checklist_item", "ladder_step",
        "log_chunk", "request_result", "artifact", "heartbeat", "run_finished", "launch_started",
    }  # fmt: skip
    for name in names - {"heartbeat"}:  # every kind is taught to the one fold of a run's events (bot/record.py)
        event = pb.RunEvent()
        getattr(event, name).SetInParent()
        assert fact_of(event) is not None, name
