"""The Slack side of an isolated rerun: the button and the command start it, and the ORIGINAL run's thread
receives its start, then its verdict with the environment differences."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bot.blocks import ACTION_RERUN
from bot.config import BotConfig
from bot.coordinator import Coordinator
from bot.store import AsyncStore, Store
from bot.web import serving
from kernel.tls import DevCerts
from tests.k3fixtures import SIM_SPEED, bot_config, rerun_left_running, runner_data, running_runner
from tests.slack_api import SlackApi, action_body, action_payload, command_body, parent_of, post, settle, signed
from tests.slack_api import slack_config as with_slack


@contextlib.asynccontextmanager
async def _cluster(
    certs: DevCerts, tmp_path: Path, api: SlackApi, isolated_speed: float = SIM_SPEED
) -> AsyncIterator[BotConfig]:
    """A regular runner with a leftover process and an isolated one on a clean host, and the bot's config."""
    regular = runner_data(certs, tmp_path / "regular", scenario="leftover-process")
    isolated = runner_data(certs, tmp_path / "isolated", scenario="healthy", speed=isolated_speed, labels=["isolated"])
    async with running_runner(regular) as a, running_runner(isolated) as b:
        runners = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
        yield with_slack(bot_config(certs, tmp_path / "k3.db", runners, isolation={"provider": "static"}), api)


async def _start(served: Any, config: BotConfig) -> str:
    """`/k3repro start cluster-a`, followed to its end; the run's id."""
    await post(served, body := command_body("start cluster-a"), signed(body))
    await settle(served)
    return Store(config.store).runs()[0].id


async def test_the_rerun_button_posts_the_verdict_and_the_differences_in_the_original_thread(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with _cluster(certs, tmp_path, api) as config:
        async with serving(config, port=0) as served:
            original = await _start(served, config)
            click = action_body(action_payload(ACTION_RERUN, original, trigger="t-rerun"))
            await post(served, click, signed(click))
            await settle(served)
            await post(served, body := command_body(f"rerun {original[:-1]} isolated"), signed(body))
            await settle(served)
    store = Store(tmp_path / "k3.db")
    reruns = store.reruns_of(original)
    assert [r.verdict for r in reruns] == ["not_reproduced", "not_reproduced"]
    parent = parent_of(api)
    assert parent is not None
    thread = [json.dumps(m["blocks"], ensure_ascii=False) for m in api.thread(parent["ts"])]
    starts = [t for t in thread if "isolated rerun" in t and "started on runner gpu-test" in t]
    verdicts = [t for t in thread if "not_reproduced" in t]
    assert len(starts) == 2 and len(verdicts) == 2
    assert "foreign GPU memory" in verdicts[0] and "suspect the environment" in verdicts[0]
    assert reruns[0].run_id in verdicts[0] and reruns[1].run_id in verdicts[1]
    answers = [c.body["text"] for c in api.called("chat.postEphemeral")]
    assert sum(f"its verdict goes to the thread of `{original}`" in a for a in answers) == 2
    actions = [(e.actor, e.action) for e in reversed(store.audit_entries())]
    assert actions == [("U-OPS", "start"), ("U-OPS", "rerun"), ("U-OPS", "rerun")]


async def test_a_rerun_a_stopped_bot_left_running_gets_its_verdict_in_the_thread_after_a_restart(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with _cluster(certs, tmp_path, api, isolated_speed=300) as config:  # a rerun of seconds: stopped mid-way
        async with serving(config, port=0) as served:
            original = await _start(served, config)
        store = AsyncStore(config.store)
        placed = await rerun_left_running(Coordinator(config, store), original)  # the bot stops mid-rerun
        store.close()
        async with serving(config, port=0) as served:  # the next start resumes it
            await settle(served)
    rerun = Store(tmp_path / "k3.db").get_rerun(placed.run_id)
    assert rerun.verdict == "not_reproduced"
    parent = parent_of(api)
    assert parent is not None
    thread = [json.dumps(m["blocks"], ensure_ascii=False) for m in api.thread(parent["ts"])]
    verdicts = [t for t in thread if "not_reproduced" in t and placed.run_id in t]
    assert len(verdicts) == 1 and "foreign GPU memory" in verdicts[0]
