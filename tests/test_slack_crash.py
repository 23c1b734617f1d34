"""Exactly once across crashes: the bot process is SIGKILLed at random points of a run, and while its posts
have landed in Slack unanswered, then started again: no message or file twice, none missing."""

from __future__ import annotations

import random
from pathlib import Path

from kernel.tls import DevCerts
from tests.slack_api import SlackApi, assert_thread_complete
from tests.slack_crash import finished, killed_run


async def test_a_bot_sigkilled_again_and_again_mid_run_posts_everything_exactly_once(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    in_flight = await killed_run(certs, tmp_path, api, kills=5, rng=random.Random(14))
    assert finished(tmp_path / "k3.db") and in_flight >= 2
    assert_thread_complete(api)
