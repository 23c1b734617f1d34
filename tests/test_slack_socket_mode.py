"""Socket Mode: the same listeners, fed envelopes over a WebSocket the bot opened (no public URL)."""

from __future__ import annotations

import time
from pathlib import Path

from bot.blocks import ACTION_RERUN
from bot.store import Store
from bot.web import serving
from kernel.tls import DevCerts
from tests.k3fixtures import bot_config, runner_data, running_runner
from tests.slack_api import (
    APP_TOKEN,
    SlackApi,
    action_payload,
    assert_thread_complete,
    command_fields,
    settle,
    slack_config,
)


async def test_socket_mode_envelopes_start_a_run_once_and_buttons_answer(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="demo")) as daemon:
        config = slack_config(
            bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"]), api, app_token=APP_TOKEN
        )
        async with serving(config, port=0) as served:
            assert api.called("apps.connections.open")
            command = command_fields("start cluster-a", trigger="trigger-socket")
            sent = time.monotonic()
            await api.send_envelope("slash_commands", command, "env-1")
            ack = await api.wait_for(lambda: api.envelopes_acked.get("env-1"), what="the ack")
            assert time.monotonic() - sent < 1.0 and "starting a run on cluster-a" in ack["text"]
            # Slack redelivers the same envelope content: it is acknowledged and changes nothing
            await api.send_envelope("slash_commands", command, "env-2", retry_attempt=1, retry_reason="timeout")
            await api.wait_for(lambda: "env-2" in api.envelopes_acked, what="the retry's ack")
            await settle(served)
            run_id = Store(tmp_path / "k3.db").runs()[0].id
            await api.send_envelope("interactive", action_payload(ACTION_RERUN, run_id, user="U-OPS"), "env-3")
            await api.wait_for(lambda: "env-3" in api.envelopes_acked, what="the button's ack")
            await settle(served)
    assert len(Store(tmp_path / "k3.db").runs()) == 1
    assert_thread_complete(api)
    answers = [c.body["text"] for c in api.called("chat.postEphemeral")]
    assert len(answers) == 1 and "no isolation provider is configured for cluster cluster-a" in answers[0]
