"""The size of a run's Slack thread: messages, file uploads and characters, for a failing and a healthy run.

Each scenario runs through the bot's Slack front-end against the local Slack Web API (tests/slack_api.py),
the way `/k3repro start cluster-a` runs it in an incident channel, and the thread is counted as it stands at
the end: replies (the checklist, one per stage, the verdict), the files uploaded into it, and the characters
of the replies' text and blocks. Run it on two checkouts to compare them.
Run: `.venv/bin/python -m bench.bench_thread [--show] [SCENARIO ...]` (default: prefix-cache-crash demo healthy);
`--show` also prints each thread as text, the card first.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from kernel.tls import write_dev_certs
from tests.k3fixtures import bot_config, runner_data, running_runner
from tests.slack_api import SlackApi, command_body, parent_of, post, settle, signed, slack_config

DEFAULT = ("prefix-cache-crash", "demo", "healthy")


async def thread_of(scenario: str, workdir: Path, show: bool = False) -> dict[str, int]:
    certs = write_dev_certs(workdir / "certs")
    api = await SlackApi().start()
    try:
        from bot.web import serving  # the bot's HTTP front-end, as `k3repro-bot serve` runs it

        async with running_runner(runner_data(certs, workdir / "runner", scenario=scenario)) as daemon:
            config = slack_config(bot_config(certs, workdir / "k3.db", [f"127.0.0.1:{daemon.port}"]), api)
            async with serving(config, port=0) as served:
                body = command_body("start cluster-a")
                await post(served, body, signed(body))
                await settle(served)
        parent = parent_of(api)
        assert parent is not None, "no card was posted"
        replies = api.thread(parent["ts"])
        if show:
            for message in [parent, *replies]:  # the mrkdwn Slack got
                print("\n".join(_mrkdwn(message.get("blocks", []))) or message.get("text", ""), end="\n\n")
            print("files: " + ", ".join(f["title"] for f in api.files), end="\n\n")
        chars = sum(len(m.get("text", "")) + len(json.dumps(m.get("blocks", []), ensure_ascii=False)) for m in replies)
        return {"replies": len(replies), "files": len(api.files), "chars": chars}
    finally:
        await api.stop()


def _mrkdwn(blocks: list[dict[str, Any]]) -> list[str]:
    """Each block's mrkdwn texts, as posted."""
    texts = [block.get("text", {}) for block in blocks] + [
        element for block in blocks for element in block.get("fields", []) + block.get("elements", [])
    ]
    return [t["text"] for t in texts if t.get("type") == "mrkdwn"]


async def main(args: list[str]) -> None:
    show = "--show" in args
    scenarios = [a for a in args if a != "--show"] or list(DEFAULT)
    rows = []
    for scenario in scenarios:
        with tempfile.TemporaryDirectory() as folder:
            size = await thread_of(scenario, Path(folder), show)
        rows.append(f"| {scenario} | {size['replies']} | {size['files']} | {size['chars']:,} |")
    print("| scenario | thread replies | files | characters of the replies |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
