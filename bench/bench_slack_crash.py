"""Exactly once across crashes, measured: runs whose bot process is SIGKILLed several times (every other kill
while a post has landed in Slack unanswered), counting duplicates and losses in the thread Slack shows.

A duplicate: a second message with a write's key, a second card, a file shared twice. A loss: a write the
outbox gave up, or one it recorded as sent that Slack does not show. Run:
`.venv/bin/python -m bench.bench_slack_crash [RUNS]`.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bot.slack.outbox import KEY_FIELD, UPLOAD
from bot.store import Store
from kernel.tls import write_dev_certs
from tests.slack_api import SlackApi
from tests.slack_crash import killed_run


def count(api: SlackApi, store_path: Path) -> tuple[int, int]:
    """(duplicates, losses) of one run."""
    keys = Counter(((m.get("metadata") or {}).get("event_payload") or {}).get(KEY_FIELD) for m in api.messages.values())
    cards = [m for m in api.messages.values() if "thread_ts" not in m]
    titles = Counter(f["title"] for f in api.files)
    duplicates = sum(n - 1 for key, n in keys.items() if key) + len(cards) - 1 + sum(n - 1 for n in titles.values())
    store = Store(store_path)
    rows = [dict(r) for r in store.db.table("slack_outbox").rows]
    store.close()
    losses = 0
    for row in rows:
        write = json.loads(row["payload_json"])
        if row["state"] != "sent":
            losses += row["method"] != "chat.postEphemeral"
        elif row["method"] == UPLOAD:
            losses += write["args"]["title"] not in titles
        elif row["method"] == "chat.postMessage":
            losses += not (keys[row["key"]] or (row["key"].endswith(":card") and cards))
    return duplicates, losses


async def one(seed: int, workdir: Path) -> tuple[int, int, int, int]:
    rng = random.Random(seed)
    kills = rng.randint(3, 6)
    api = await SlackApi().start()
    try:
        in_flight = await killed_run(write_dev_certs(workdir / "certs"), workdir, api, kills, rng)
    finally:
        await api.stop()
    return (kills, in_flight, *count(api, workdir / "k3.db"))


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    totals = Counter[str]()
    for seed in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            kills, in_flight, duplicates, losses = asyncio.run(one(seed, Path(tmp)))
        totals.update(kills=kills, in_flight=in_flight, duplicates=duplicates, losses=losses)
        print(f"run {seed + 1:>2}: {kills} SIGKILLs ({in_flight} mid-call), {duplicates} duplicates, {losses} losses")
    print(
        f"{runs} runs: {totals['kills']} SIGKILLs ({totals['in_flight']} while a post had landed unanswered), "
        f"{totals['duplicates']} duplicates, {totals['losses']} losses"
    )


if __name__ == "__main__":
    main()
