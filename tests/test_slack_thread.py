"""A run started from Slack, end to end over real HTTP: signed slash command → real runner (sim) → the thread."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from matplotlib.image import imread

from bot.blocks import ACTION_CANCEL, ACTION_RERUN, MAX_BLOCKS, MAX_MESSAGE, MAX_SECTION
from bot.bundle import PNG_SIGNATURE, parse_bundle
from bot.store import Store
from bot.web import Served, serving
from kernel.tls import DevCerts
from protos.vocab import CHECKLIST_IDS
from tests.k3fixtures import bot_config
from tests.slack_api import (
    SIGNING_SECRET,
    TEAM_DOMAIN,
    SlackApi,
    action_body,
    action_payload,
    block_text,
    command_body,
    parent_of,
    post,
    settle,
    signed,
    slack_bot,
    slack_config,
)


def verdict_posted(api: SlackApi) -> bool:
    return any(m.get("reply_broadcast") for m in api.messages.values())


async def test_a_slash_command_starts_a_run_whose_thread_tells_the_story(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with slack_bot(certs, tmp_path, api) as served:
        status, answer = await post(served, body := command_body("start cluster-a"), signed(body))
        assert status == 200 and "starting a run on cluster-a" in answer
        await settle(served)
        run = Store(tmp_path / "k3.db").runs()[0]

    parent = parent_of(api)
    assert parent is not None and parent["metadata"]["event_payload"]["run_id"] == run.id
    replies = api.thread(parent["ts"])
    checklist, *stages, verdict = replies
    # the checklist: posted once, then chat.update in the same twelve-block layout, ending in the final state
    checklist_updates = [c.body for c in api.called("chat.update") if c.body["ts"] == checklist["ts"]]
    assert checklist_updates, "the checklist was never updated"
    assert {len(u["blocks"]) for u in checklist_updates} == {len(CHECKLIST_IDS) + 2}
    assert [b.get("block_id") for b in checklist_updates[-1]["blocks"][1:-1]] == CHECKLIST_IDS
    assert any("stage `minimal_launch` · phase `gpu_detect`" in u["text"] for u in checklist_updates)
    assert "run completed" in checklist_updates[-1]["text"] and checklist["blocks"] == checklist_updates[-1]["blocks"]
    assert "✅ *first_error_saved*" in block_text(checklist)
    # one message per stage, the failure with its phase, category, first error, context, hint and OOM call
    heads = [s["text"].split(":")[0] for s in stages]
    assert heads[0] == "✅ freeze" and heads.index("❌ minimal_launch") < heads.index("⏭ single_request")
    failure = block_text(stages[heads.index("❌ minimal_launch")])
    for expected in ("gpu_detect", "nccl_comm", "NCCL error: unhandled system error", "*Hint:*", "*Context*"):
        assert expected in failure
    assert "*Secondary OOM*\\nno" in failure
    # the verdict, broadcast to the channel
    assert verdict["reply_broadcast"] is True and "Verdict: continue" in block_text(verdict)
    # the card: final status, no Cancel once the run ended; files in the thread, once each
    assert "completed" in parent["text"] and ACTION_CANCEL not in block_text(parent) and parent["updates"] > 0
    assert "*Digest*\\nnone: known by tag only" in block_text(parent)  # the sim's image has no registry digest
    verdict_at = next(c.at for c in api.called("chat.postMessage") if c.body.get("reply_broadcast"))
    completed = [
        c.at for c in api.called("chat.update") if c.body["ts"] == parent["ts"] and "completed" in c.body["text"]
    ]
    assert completed and min(completed) > verdict_at  # the card never says more than the thread shows
    # two files, after the verdict: the timeline and the run's bundle (the scene, every log, the report)
    assert sorted(f["title"] for f in api.files) == ["bundle", "timeline"]
    assert all(f["thread_ts"] == parent["ts"] and f["channel"] == "C-OPS" for f in api.files)
    bundle = parse_bundle(next(f["data"] for f in api.files if f["title"] == "bundle"))
    assert bundle.run["id"] == run.id and bundle.run["status"] == "completed"
    assert "NCCL error" in bundle.members["logs/minimal_launch.log"].decode()
    assert {"fingerprint.json", "report.json"} <= set(bundle.members)
    # the timeline picture: drawn from the run's stored events, uploaded once, after the verdict
    (picture,) = [f for f in api.files if f["title"] == "timeline"]
    assert picture["data"].startswith(PNG_SIGNATURE)
    assert imread(io.BytesIO(picture["data"]), format="png").shape[1] > 1000
    (asked,) = [c for c in api.called("files.getUploadURLExternal") if c.body["filename"].endswith(".png")]
    assert asked.body["filename"] == f"timeline-{run.id}.png" and int(asked.body["length"]) == len(picture["data"])
    assert asked.at > verdict_at
    (uploaded,) = [c for c in api.called("upload") if c.body["file_id"] == picture["id"]]
    assert uploaded.body["size"] == len(picture["data"])
    (completed_upload,) = [c for c in api.called("files.completeUploadExternal") if picture["id"] in c.body["files"]]
    assert completed_upload.at > uploaded.at
    for message in api.messages.values():
        assert len(message["blocks"]) <= MAX_BLOCKS and len(json.dumps(message["blocks"])) <= MAX_MESSAGE
        assert all(len(b.get("text", {}).get("text", "")) <= MAX_SECTION for b in message["blocks"])
    audit = Store(tmp_path / "k3.db").audit_entries()
    assert [(a.actor, a.action, a.via, a.place) for a in audit] == [("U-OPS", "start", "slack", "C-OPS")]


@contextlib.asynccontextmanager
async def bot_without_runner(tmp_path: Path, api: SlackApi, **settings: Any) -> AsyncIterator[Served]:
    """For requests that must be answered without any run starting: the runner address is never dialled."""
    config = slack_config(bot_config(None, tmp_path / "k3.db", ["127.0.0.1:9"]), api, **settings)
    async with serving(config, port=0) as served:
        yield served


def nothing_changed(tmp_path: Path, api: SlackApi) -> bool:
    store = Store(tmp_path / "k3.db")
    unchanged = not store.runs() and not store.changes("cluster-a") and not store.audit_entries()
    store.close()
    return unchanged and not api.called("chat.postMessage", None) and not api.called("chat.update", None)


@pytest.mark.parametrize(
    ("text", "user", "channel", "expected"),
    [
        ("start cluster-z", "U-OPS", "C-OPS", "unknown cluster 'cluster-z' (known: cluster-a)"),
        ("start cluster-a", "U-OPS", "C-RANDOM", "can only be operated from <#C-OPS>"),
        ("note cluster-a driver bumped", "U-OPS", "C-RANDOM", "can only be operated from <#C-OPS>"),
        ("start", "U-OPS", "C-OPS", "missing CLUSTER. Usage: `start CLUSTER [--profile P] [--image REF]`"),
        ("start cluster-a --flavour x", "U-OPS", "C-OPS", "unknown option `--flavour` (options: --profile, --image)"),
        ("start 'cluster-a", "U-OPS", "C-OPS", "cannot read the arguments (No closing quotation)"),
        ("launch cluster-a", "U-OPS", "C-OPS", "unknown subcommand `launch`. Accepted: `start`, `status`"),
        ("rerun 2026 elsewhere", "U-OPS", "C-OPS", "`elsewhere` is not accepted here (expected: isolated)"),
        ("runs " + "x" * 1200, "U-OPS", "C-OPS", "at most 1000 are accepted"),
    ],
)
async def test_bad_input_is_refused_in_the_ack_and_changes_nothing(
    tmp_path: Path, api: SlackApi, text: str, user: str, channel: str, expected: str
) -> None:
    async with bot_without_runner(tmp_path, api) as served:
        body = command_body(text, user=user, channel=channel)
        status, answer = await post(served, body, signed(body))
        await served.bot.idle()
    assert status == 200
    ack = json.loads(answer)
    assert ack["response_type"] == "ephemeral" and expected in ack["text"]
    assert nothing_changed(tmp_path, api)


async def test_a_user_outside_the_operators_and_their_groups_is_refused_after_the_ack(
    tmp_path: Path, api: SlackApi
) -> None:
    api.groups["S-SRE"] = ["U-SRE"]
    async with bot_without_runner(tmp_path, api) as served:
        body = command_body("start cluster-a", user="U-RANDOM")
        status, _ = await post(served, body, signed(body))
        await served.bot.idle()
        assert status == 200
        refusal = api.called("chat.postEphemeral")[0].body
        assert refusal["user"] == "U-RANDOM" and refusal["channel"] == "C-OPS"
        assert "<@U-RANDOM> is not an operator of cluster cluster-a" in refusal["text"]
        assert nothing_changed(tmp_path, api)
        # a member of an operators' user group may: its note is stored, audited with who, what and where
        body = command_body("note cluster-a driver 580.82 -> 580.95 on gpu-a1", user="U-SRE")
        await post(served, body, signed(body))
        await served.bot.idle()
    assert "noted for cluster-a" in api.called("chat.postEphemeral")[-1].body["text"]
    assert [c.body["usergroup"] for c in api.called("usergroups.users.list")] == ["S-SRE"]  # cached after that
    store = Store(tmp_path / "k3.db")
    assert [c.what for c in store.changes("cluster-a")] == ["driver 580.82 -> 580.95 on gpu-a1"]
    assert [(a.actor, a.action, a.place) for a in store.audit_entries()] == [("U-SRE", "note", "C-OPS")]


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"X-Slack-Signature": "v0=" + "0" * 64}, "wrong signature"),
        ({"X-Slack-Request-Timestamp": "1"}, "timestamp outside the 5-minute window"),
        ({"X-Slack-Signature": ""}, "no signature"),
    ],
)
async def test_a_request_without_a_valid_signature_gets_401_and_nothing_reaches_slack(
    tmp_path: Path, api: SlackApi, headers: dict[str, str], why: str
) -> None:
    async with bot_without_runner(tmp_path, api) as served:
        body = command_body("start cluster-a")
        status, _ = await post(served, body, {**signed(body), **headers})
        await served.bot.idle()
        assert served.bot.metrics.value("k3repro_slack_http_requests_total", status="401") == 1
    assert status == 401, why
    assert [c.method for c in api.calls] == ["auth.test"]  # the bot's own start-up call, nothing since
    assert nothing_changed(tmp_path, api)


async def test_a_stale_but_correctly_signed_request_is_refused(tmp_path: Path, api: SlackApi) -> None:
    async with bot_without_runner(tmp_path, api) as served:
        body = command_body("start cluster-a")
        status, _ = await post(served, body, signed(body, timestamp=int(time.time()) - 301))
    assert status == 401 and nothing_changed(tmp_path, api)


async def test_a_retried_delivery_never_starts_a_second_run(certs: DevCerts, tmp_path: Path, api: SlackApi) -> None:
    async with slack_bot(certs, tmp_path, api) as served:
        body = command_body("start cluster-a", trigger="trigger-once")
        first, retry = await asyncio.gather(
            post(served, body, signed(body)),
            post(served, body, signed(body, **{"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"})),
        )
        await settle(served)
        runs = Store(tmp_path / "k3.db").runs()
    assert first[0] == retry[0] == 200
    assert len(runs) == 1
    cards = [c for c in api.called("chat.postMessage") if "thread_ts" not in c.body]
    assert len(cards) == 1
    assert not api.called("chat.postEphemeral")  # the retry is silent, not "already active"


async def test_a_second_start_points_to_the_active_thread_and_the_cancel_button_stops_the_run(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with slack_bot(certs, tmp_path, api, scenario="healthy", speed=4) as served:
        body = command_body("start cluster-a")
        await post(served, body, signed(body))
        parent = await api.wait_for(lambda: parent_of(api), what="the run card")
        run_id = parent["metadata"]["event_payload"]["run_id"]
        body = command_body("start cluster-a", user="U-OPS")
        await post(served, body, signed(body))
        pointer = await api.wait_for(lambda: api.called("chat.postEphemeral"), what="the refusal")
        link = f"https://{TEAM_DOMAIN}.slack.com/archives/C-OPS/p{parent['ts'].replace('.', '')}"
        assert f"already has an active run, `{run_id}`" in pointer[0].body["text"] and link in pointer[0].body["text"]
        assert len(Store(tmp_path / "k3.db").runs()) == 1
        # Cancel is a real button click: a signed block_actions POST
        click = action_body(action_payload(ACTION_CANCEL, run_id))
        status, _ = await post(served, click, signed(click))
        assert status == 200
        await settle(served)
    run = Store(tmp_path / "k3.db").get_run(run_id)
    assert run.status == "cancelled"
    assert "cancel" in api.called("chat.postEphemeral")[-1].body["text"]
    assert "cancelled" in parent["text"] and ACTION_CANCEL not in block_text(parent)
    assert any("Run cancelled" in block_text(m) for m in api.thread(parent["ts"]) if m.get("reply_broadcast"))
    assert any("cancelled by <@U-OPS>" in block_text(m) for m in api.thread(parent["ts"]))
    actions = [(a.actor, a.action, a.place) for a in reversed(Store(tmp_path / "k3.db").audit_entries())]
    assert actions == [("U-OPS", "start", "C-OPS"), ("U-OPS", "cancel", "C-OPS")]


async def test_rerun_on_an_isolated_node_says_no_provider_is_configured_and_changes_nothing(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with slack_bot(certs, tmp_path, api) as served:
        body = command_body("start cluster-a")
        await post(served, body, signed(body))
        await settle(served)
        run_id = Store(tmp_path / "k3.db").runs()[0].id
        before = len(api.calls)
        click = action_body(action_payload(ACTION_RERUN, run_id, trigger="t-rerun"))
        await post(served, click, signed(click))
        body = command_body(f"rerun {run_id} isolated")
        await post(served, body, signed(body))
        await settle(served)
    answers = [c.body["text"] for c in api.calls[before:]]
    expected = "no isolation provider is configured for cluster cluster-a ([isolation] in the bot's config); nothing"
    assert len(answers) == 2 and all(expected in answer for answer in answers)
    assert len(Store(tmp_path / "k3.db").runs()) == 1


async def test_read_only_commands_answer_ephemerally(certs: DevCerts, tmp_path: Path, api: SlackApi) -> None:
    async with slack_bot(certs, tmp_path, api) as served:
        body = command_body("start cluster-a")
        await post(served, body, signed(body))
        await settle(served)
        run_id = Store(tmp_path / "k3.db").runs()[0].id
        answers: dict[str, str] = {}
        texts = (
            "help",
            "",
            "runs",
            f"status {run_id[:15]}",
            "status",
            "status nosuchrun",
            "runners",
            "runners cluster-a",
        )
        for text in (*texts, "baseline"):
            before = len(api.called("chat.postEphemeral"))
            scoped = text.startswith(("runs", "status"))  # a cluster's operators, in its channel (test_security_limits)
            body = command_body(text) if scoped else command_body(text, user="U-SOMEONE", channel="C-ELSEWHERE")
            status, ack = await post(served, body, signed(body))
            await served.bot.idle()
            after = api.called("chat.postEphemeral")
            answers[text] = json.loads(ack)["text"] if ack else after[-1].body["text"]
            assert status == 200 and len(after) == before + (0 if ack else 1), text
        body = command_body("runners")  # an operator of cluster-a, anywhere
        await post(served, body, signed(body))
        await served.bot.idle()
        operator_runners = api.called("chat.postEphemeral")[-1].body["text"]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{served.port}/healthz") as response:
                assert response.status == 200
            async with session.get(f"http://127.0.0.1:{served.port}/metrics") as response:
                metrics = await response.text()
    assert "`/k3repro start CLUSTER [--profile P] [--image REF]`" in answers["help"] and answers[""] == answers["help"]
    assert run_id in answers["runs"] and "completed" in answers["runs"]
    assert run_id in answers[f"status {run_id[:15]}"] and "/archives/C-OPS/p" in answers[f"status {run_id[:15]}"]
    assert answers["status"].startswith("no run is active")
    assert answers["status nosuchrun"] == "⛔ no run 'nosuchrun'"
    assert "gpu-test" in answers["runners"] and "idle" in answers["runners"]
    assert answers["runners cluster-a"] == answers["runners"]
    assert (
        "127.0.0.1" not in answers["runners"] and "addresses are shown to the cluster's operators" in answers["runners"]
    )
    assert "127.0.0.1:" in operator_runners and "addresses are shown" not in operator_runners
    assert answers["baseline"].startswith("*baseline kimi-k3*") and "`host_driver_r580`" in answers["baseline"]
    assert 'k3repro_slack_writes_total{method="chat.postMessage",outcome="sent"}' in metrics
    assert "k3repro_slack_outbox_pending 0" in metrics


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("--image registry.example/unknown:latest", "registry.example/unknown:latest"),
        # refused at StartRun, before a freeze: not "❌ baseline — unknown baseline profile" in a completed card
        ("--profile nope", "unknown baseline profile 'nope' (known: kimi-k3)"),
    ],
)
async def test_a_start_the_runner_refuses_posts_only_the_refusal(
    certs: DevCerts, tmp_path: Path, api: SlackApi, option: str, words: str
) -> None:
    async with slack_bot(certs, tmp_path, api) as served:
        body = command_body(f"start cluster-a {option}")
        await post(served, body, signed(body))
        await settle(served)
    store = Store(tmp_path / "k3.db")
    assert not store.runs() and [a.action for a in store.audit_entries()] == ["start refused"]
    assert parent_of(api) is None and api.called("chat.postMessage") == []
    (refusal,) = [c.body["text"] for c in api.called("chat.postEphemeral")]
    assert "refused the run" in refusal and words in refusal


async def test_k3repro_bot_serve_reads_its_config_serves_health_and_stops_on_sigterm(
    tmp_path: Path, api: SlackApi
) -> None:
    config = tmp_path / "k3repro.toml"
    config.write_text(
        f"""store = "k3.db"
[slack]
api_url = "{api.url}"
listen = "127.0.0.1:0"
[clusters.cluster-a]
runners = ["127.0.0.1:9"]
image = "vllm/vllm-openai:kimi-k3"
launch = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8"
channels = ["C-OPS"]
operators = ["U-OPS"]
"""
    )
    env = {**os.environ, "SLACK_BOT_TOKEN": "xoxb-from-env", "SLACK_SIGNING_SECRET": SIGNING_SECRET}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.main", "--config", str(config), "serve", env=env, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    port = 0
    while not port:
        line = (await asyncio.wait_for(process.stderr.readline(), 20)).decode()
        assert line, "k3repro-bot exited before serving"
        if match := re.search(r"serving \(HTTP\) on port (\d+)", line):
            port = int(match.group(1))
    async with aiohttp.ClientSession() as session:  # HTTP is up at once; ready once Slack said who the bot is
        for _ in range(600):
            async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                health = (response.status, await response.json())
            if health[0] == 200:
                break
            await asyncio.sleep(0.05)
        assert health == (200, {"ok": True})
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 20) == 0
    assert [c.method for c in api.calls] == ["auth.test"]
