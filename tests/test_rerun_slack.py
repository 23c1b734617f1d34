"""The Slack side of an isolated rerun: the button and the command start it, and the ORIGINAL run's thread
receives its start, then its verdict with the environment differences."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from bot.blocks import ACTION_RERUN
from bot.consumer import follow_run
from bot.coordinator import Coordinator
from bot.rerun import place_rerun
from bot.store import AsyncStore, Store
from bot.web import serving
from protos import runner_pb2 as pb
from runner.tls import DevCerts
from tests.k3fixtures import bot_config, runner_data, running_runner
from tests.slack_api import SlackApi, action_body, action_payload, command_body, parent_of, post, settle, signed
from tests.slack_api import slack_config as with_slack


async def test_the_rerun_button_posts_the_verdict_and_the_differences_in_the_original_thread(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    regular = runner_data(certs, tmp_path / "regular", scenario="leftover-process", speed=800)
    isolated = runner_data(certs, tmp_path / "isolated", scenario="healthy", speed=800, labels=["isolated"])
    async with running_runner(regular) as a, running_runner(isolated) as b:
        runners = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
        config = with_slack(bot_config(certs, tmp_path / "k3.db", runners, isolation={"provider": "static"}), api)
        async with serving(config, port=0) as served:
            await post(served, body := command_body("start cluster-a"), signed(body))
            await settle(served)
            original = Store(tmp_path / "k3.db").runs()[0]["id"]
            click = action_body(action_payload(ACTION_RERUN, original, trigger="t-rerun"))
            await post(served, click, signed(click))
            await settle(served)
            await post(served, body := command_body(f"rerun {original[:-1]} isolated"), signed(body))
            await settle(served)
    store = Store(tmp_path / "k3.db")
    reruns = store.reruns_of(original)
    assert [r["verdict"] for r in reruns] == ["not_reproduced", "not_reproduced"]
    parent = parent_of(api)
    assert parent is not None
    thread = [json.dumps(m["blocks"], ensure_ascii=False) for m in api.thread(parent["ts"])]
    starts = [t for t in thread if "isolated rerun" in t and "started on runner gpu-test" in t]
    verdicts = [t for t in thread if "not_reproduced" in t]
    assert len(starts) == 2 and len(verdicts) == 2
    assert "foreign GPU memory" in verdicts[0] and "suspect the environment" in verdicts[0]
    assert reruns[0]["run_id"] in verdicts[0] and reruns[1]["run_id"] in verdicts[1]
    answers = [c.body["text"] for c in api.called("chat.postEphemeral")]
    assert sum(f"its verdict goes to the thread of `{original}`" in a for a in answers) == 2
    actions = [(e["actor"], e["action"]) for e in reversed(store.audit_entries())]
    assert actions == [("U-OPS", "start"), ("U-OPS", "rerun"), ("U-OPS", "rerun")]


async def test_a_rerun_a_stopped_bot_left_running_gets_its_verdict_in_the_thread_after_a_restart(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    regular = runner_data(certs, tmp_path / "regular", scenario="leftover-process", speed=800)
    isolated = runner_data(certs, tmp_path / "isolated", scenario="healthy", speed=100, labels=["isolated"])
    async with running_runner(regular) as a, running_runner(isolated) as b:
        runners = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
        config = with_slack(bot_config(certs, tmp_path / "k3.db", runners, isolation={"provider": "static"}), api)
        async with serving(config, port=0) as served:
            await post(served, body := command_body("start cluster-a"), signed(body))
            await settle(served)
        original = Store(tmp_path / "k3.db").runs()[0]["id"]
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        placed = await place_rerun(core, original, "U-OPS")
        launching = asyncio.Event()

        async def watch(event: pb.RunEvent) -> None:
            launching.set()

        follower = asyncio.create_task(
            follow_run(config, store, placed.run_id, placed.placement.address, watch, placed.request)
        )
        await launching.wait()
        follower.cancel()  # the bot stops while the rerun runs
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        store.close()
        async with serving(config, port=0) as served:  # the next start resumes it
            await settle(served)
    rerun = Store(tmp_path / "k3.db").get_rerun(placed.run_id)
    assert rerun["verdict"] == "not_reproduced"
    parent = parent_of(api)
    assert parent is not None
    thread = [json.dumps(m["blocks"], ensure_ascii=False) for m in api.thread(parent["ts"])]
    verdicts = [t for t in thread if "not_reproduced" in t and placed.run_id in t]
    assert len(verdicts) == 1 and "foreign GPU memory" in verdicts[0]
