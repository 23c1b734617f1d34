"""Command parsing and Block Kit rendering: pure functions, no Slack needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot import blocks, rich
from bot.config import parse_bot_config
from bot.record import LadderStep, RunRecord, StageResult, fact_of
from bot.slack.commands import Command, CommandError, parse
from kernel.toml_reader import ConfigError
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("start cluster-a", Command("start", {"cluster": "cluster-a"})),
        (
            "START cluster-a --image vllm/vllm-openai:v0.33 --profile kimi-k3",
            Command("start", {"cluster": "cluster-a", "image": "vllm/vllm-openai:v0.33", "profile": "kimi-k3"}),
        ),
        ("status", Command("status", {})),
        ("status 20261130-0958", Command("status", {"run": "20261130-0958"})),
        ("rerun 20261130 isolated", Command("rerun", {"run": "20261130", "where": "isolated"})),
        ("runners", Command("runners", {})),
        ("baseline kimi-k3", Command("baseline", {"profile": "kimi-k3"})),
        (
            'note cluster-a driver 580.82 -&gt; 580.95, "don\'t" reboot',
            Command("note", {"cluster": "cluster-a", "text": 'driver 580.82 -> 580.95, "don\'t" reboot'}),
        ),
        ("  ", Command("help", {})),
    ],
)
def test_commands_parse(text: str, expected: Command) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("note cluster-a", "missing TEXT. Usage: `note CLUSTER TEXT`"),
        ("note", "missing CLUSTER. Usage"),
        ("cancel", "missing RUN. Usage: `cancel RUN`"),
        ("runs everything", "unexpected `everything`"),
        ("start cluster-a --image", "`--image` needs a value"),
        ("rerun 2026", "missing WHERE"),
    ],
)
def test_malformed_commands_say_what_is_wrong_and_what_is_accepted(text: str, message: str) -> None:
    with pytest.raises(CommandError) as caught:
        parse(text)
    assert message in str(caught.value)


def _view() -> RunRecord:
    return RunRecord("20261130-1000-abcd", "cluster-a", "127.0.0.1:1", "vllm/vllm-openai:kimi-k3", "U1")


def test_the_checklist_keeps_one_block_layout_from_first_to_last_state() -> None:
    view = _view()
    first = blocks.checklist(view)
    for item in range(1, len(CHECKLIST_IDS) + 1):
        view.apply(
            pb.RunEvent(checklist_item=pb.ChecklistItem(item=item, state=pb.CHECKLIST_STATE_HOLDS, evidence="x" * 5000))
        )
    view.apply(pb.RunEvent(run_finished=pb.RunFinished(status=pb.RUN_STATUS_COMPLETED, decision=pb.DECISION_FIX)))
    last = blocks.checklist(view)
    assert [(b["type"], b.get("block_id")) for b in first.blocks] == [
        (b["type"], b.get("block_id")) for b in last.blocks
    ]
    assert (
        f"{len(CHECKLIST_IDS)}/{len(CHECKLIST_IDS)} hold" in last.text
        and "run completed" in last.text
        and not last.overflow
    )


def test_a_stage_result_too_big_for_slack_is_shortened_and_its_full_text_kept_for_a_file() -> None:
    view = _view()
    view.apply(pb.RunEvent(stage_started=pb.StageStarted(stage=pb.STAGE_MINIMAL_LAUNCH)))
    huge = pb.FirstError(
        phase=pb.PHASE_ENGINE_INIT,
        category=pb.ERROR_CATEGORY_OOM,
        line="torch.OutOfMemoryError: CUDA out of memory. " + "x" * 6000,
        context=[f"context line {n} " + "y" * 900 for n in range(40)],
        secondary_oom=True,
        hint="free the GPUs",
    )
    view.apply(pb.RunEvent(first_error=huge))
    finished = pb.StageFinished(stage=pb.STAGE_MINIMAL_LAUNCH, status=pb.STAGE_STATUS_FAILED, summary="failed")
    result = view.apply(pb.RunEvent(stage_finished=finished))
    assert isinstance(result, StageResult)
    message = blocks.stage_result(view, result)
    assert len(message.blocks) <= blocks.MAX_BLOCKS and len(json.dumps(message.blocks)) <= blocks.MAX_MESSAGE
    assert all(len(b.get("text", {}).get("text", "")) <= blocks.MAX_SECTION for b in message.blocks)
    assert "Shortened to fit Slack" in json.dumps(message.blocks)
    assert "x" * 6000 in message.overflow and "context line 5 " in message.overflow
    assert "yes — an OOM was seen" in message.overflow


def test_the_card_carries_the_run_id_and_buttons_until_the_run_ends() -> None:
    view = _view()
    artifact = pb.Artifact(
        name="fingerprint",
        media_type="application/json",
        content=json.dumps(
            {
                "host": {"hostname": "gpu-a1"},
                "image": {"ref": "vllm/vllm-openai:kimi-k3", "repo_digests": ["vllm/vllm-openai@sha256:abc"]},
            }
        ),
    )
    view.apply(pb.RunEvent(artifact=artifact))
    running = blocks.card(view)
    assert blocks.metadata(view) == {
        "event_type": "k3repro_run",
        "event_payload": {"run_id": view.run_id, "cluster": "cluster-a"},
    }
    text = json.dumps(running.blocks)
    assert "gpu-a1 (127.0.0.1:1)" in text and "sha256:abc" in text
    assert [e["action_id"] for e in running.blocks[-1]["elements"]] == [blocks.ACTION_RERUN, blocks.ACTION_CANCEL]
    view.apply(pb.RunEvent(run_finished=pb.RunFinished(status=pb.RUN_STATUS_CANCELLED)))
    assert [e["action_id"] for e in blocks.card(view).blocks[-1]["elements"]] == [blocks.ACTION_RERUN]


def test_the_ladder_is_one_block_of_its_steps_with_the_moot_ones_named_together() -> None:
    ran = pb.LadderStepResult(
        step="prefix_caching",
        title="prefix caching",
        outcome=pb.LADDER_OUTCOME_CACHE_HIT,
        detail="hits 12/12",
        relaunched=True,
        added=["--enable-prefix-caching"],
    )
    moot = [
        pb.LadderStepResult(step=s, title=t, outcome=pb.LADDER_OUTCOME_NOT_APPLICABLE, detail="no flags")
        for s, t in (("kv_transfer", "KV transfer"), ("lora_multimodal", "LoRA and multimodal"))
    ]
    last = pb.LadderStepResult(
        step="as_written",
        title="the deployment as written",
        outcome=pb.LADDER_OUTCOME_NOT_APPLICABLE,
        detail="not launched: step prefix_caching already met the failure",
        as_written=True,
    )
    facts = [fact_of(pb.RunEvent(ladder_step=step)) for step in (ran, *moot, last)]
    assert all(isinstance(fact, LadderStep) for fact in facts)
    text = rich.mrkdwn(blocks.ladder_summary(f for f in facts if isinstance(f, LadderStep)).body)
    first, why, second = text.split("\n")
    assert first == "🪜 *prefix caching*: `cache_hit` (relaunched) — adds `--enable-prefix-caching`"
    assert why == "➖ *the deployment as written*: not launched: step prefix_caching already met the failure"
    assert second.endswith("KV transfer, LoRA and multimodal") and "no flags" not in text


def test_slack_settings_come_from_the_file_or_the_environment_and_secrets_are_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {"clusters": {"c": {"runners": ["h:1"], "image": "i", "launch": "vllm serve m", "channels": ["C1"]}}}
    for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert parse_bot_config(base, base=tmp_path, origin="t").slack is None
    with pytest.raises(ConfigError, match=r"t \[slack\]: 'signing_secret' is not set \(nor \$SLACK_SIGNING_SECRET\)"):
        parse_bot_config({**base, "slack": {"bot_token": "xoxb-1"}}, base=tmp_path, origin="t")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "from-env")
    config = parse_bot_config({**base, "slack": {"bot_token": "xoxb-1", "listen": ":8080"}}, base=tmp_path, origin="t")
    assert config.slack is not None
    assert (config.slack.signing_secret, config.slack.api_url, config.slack.listen) == (
        "from-env",
        "https://slack.com/api/",
        ":8080",
    )
    assert (config.clusters["c"].channels, config.clusters["c"].operators) == (("C1",), ())


def test_more_blocks_than_slack_takes_are_cut_to_fifty_with_the_rest_in_the_overflow() -> None:
    message = blocks.fit("many", [blocks.section(f"line {n}") for n in range(60)])
    assert len(message.blocks) == blocks.MAX_BLOCKS and message.blocks[-1] == blocks.SHORTENED
    assert "line 59" in message.overflow and "line 59" not in json.dumps(message.blocks)
    exactly = blocks.fit("fifty", [blocks.section(f"line {n}") for n in range(50)])
    assert len(exactly.blocks) == 50 and not exactly.overflow
