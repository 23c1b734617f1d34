"""`k3repro runs`, `k3repro show RUN`, `k3repro cancel RUN`, `k3repro runners`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from dataclasses import asdict
from typing import Any

from google.protobuf import json_format

from bot import rich
from bot.answers import cancelled, runner_line
from bot.bundle import is_imported, public_request
from bot.commands.common import CommandError, coordinator, load_config, operator
from bot.config import BotConfig
from bot.record import RunRecord
from bot.refusal import Refused
from bot.render import TextRenderer, run_header, terminal, unmentioned
from bot.report import report
from bot.store import ACTIVE, Run, RunNotFound, Store, redacted
from bot.timeline import caption, draw
from kernel.redact import redactor
from kernel.toml_reader import ConfigError


def list_runs(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    rows = Store(config.store).runs(limit=args.limit)
    if any(run.status in ACTIVE for run in rows):
        rows = asyncio.run(_settled(config, rows))
    if not rows:
        print("no runs yet")
    for run in rows:
        line = (
            f"{run.id}  {run.cluster:<14} {run.status:<10} {kind(run):<8} {run.decision or '-':<9} {run.summary or ''}"
        )
        print(terminal(unmentioned(line)))
    return 0


def kind(run: Run) -> str:
    """What made the run: `run` (a start), `rerun` (an isolated rerun), `minimize` or `imported` (a bundle)."""
    if run.rerun_of:
        return "rerun"
    if is_imported(run):
        return "imported"
    return "minimize" if run.minimize_of else "run"


def related(store: Store, run: Run) -> dict[str, Any]:
    """The runs linked to `run`: its original (a rerun's, a minimize run's), its isolated reruns with their
    verdicts and its minimize runs with how they ended."""
    links: dict[str, Any] = {"kind": kind(run)}
    if run.rerun_of:
        links["rerun_of"] = run.rerun_of
        links["verdict"] = store.get_rerun(run.id).verdict
    if run.minimize_of:
        links["minimize_of"] = run.minimize_of
    links["reruns"] = [
        {"run_id": rerun.run_id, "provider": rerun.provider, "verdict": rerun.verdict}
        for rerun in store.reruns_of(run.id)
    ]
    links["minimize_runs"] = [
        {"run_id": m.id, "status": m.status, "summary": m.summary or ""} for m in store.minimize_runs_of(run.id)
    ]
    return links


def related_lines(links: dict[str, Any]) -> list[str]:
    lines = []
    if "rerun_of" in links:
        lines.append(f"isolated rerun of {links['rerun_of']} · verdict {links['verdict'] or 'none yet'}")
    if "minimize_of" in links:
        lines.append(f"minimize run of {links['minimize_of']}")
    lines += [
        f"isolated rerun {r['run_id']} ({r['provider']}) · verdict {r['verdict'] or 'none yet'}"
        for r in links["reruns"]
    ]
    lines += [
        f"minimize run {m['run_id']} · {m['status']}" + (f" · {m['summary']}" if m["summary"] else "")
        for m in links["minimize_runs"]
    ]
    return [terminal(unmentioned(line)) for line in lines]


async def _settled(config: BotConfig, rows: list[Run]) -> list[Run]:
    """The rows with each active run as its runner knows it (one whose follower died may have ended); without
    usable TLS files the runners cannot be asked, and the list is the store's."""
    try:
        async with coordinator(config) as core:
            return [await core.settle(run) for run in rows]
    except ConfigError:
        return rows


def show_run(args: argparse.Namespace) -> int:
    store = Store(load_config(args.config).store)
    try:
        run = store.get_run(args.run)
    except RunNotFound as exc:
        raise CommandError(str(exc)) from None
    events = [redactor().message(event) for event in store.events(run.id)]
    record = RunRecord.replay(run.id, events)
    if args.timeline is not None:
        try:
            drawn = draw(record.launches, args.timeline, caption(run.id, run.cluster, run.decision or run.status))
            print(f"timeline of {drawn} launch(es) written to {args.timeline}", file=sys.stderr)
        except OSError as exc:
            raise CommandError(f"cannot write the timeline {args.timeline}: {exc.strerror or exc}") from None
    links = related(store, run)
    if args.json:  # json.dumps escapes control characters: the output is safe for a terminal as it is
        shown = {**redacted(asdict(run)), "request_json": public_request(run, record)}  # JSON as JSON, not text
        payload = {
            "run": shown,
            "links": links,
            "report": report(record),  # the `demo --json` contract, for every run
            "events": [_json_artifacts(json_format.MessageToDict(event)) for event in events],
        }
        print(json.dumps(payload, indent=2))
        return 0
    print(run_header(run))
    for line in related_lines(links):
        print(line)
    renderer = TextRenderer(logs=args.logs)
    for event in events:
        for line in renderer.lines(event):
            print(line)
    return 0


def _json_artifacts(value: Any) -> Any:
    """An event as JSON with each application/json artifact's content as the object it holds (text it cannot
    read stays text)."""
    if isinstance(value, list):
        return [_json_artifacts(item) for item in value]
    if not isinstance(value, dict):
        return value
    shown = {key: _json_artifacts(item) for key, item in value.items()}
    if shown.get("mediaType") == "application/json" and isinstance(shown.get("content"), str):
        with contextlib.suppress(ValueError):
            shown["content"] = json.loads(shown["content"])
    return shown


def cancel_run(args: argparse.Namespace) -> int:
    async def cancel() -> str:
        async with coordinator(load_config(args.config)) as core:
            return rich.plain(cancelled(await core.cancel(args.run, operator())))

    try:
        print(asyncio.run(cancel()))
    except (RunNotFound, Refused) as exc:
        raise CommandError(str(exc)) from None
    return 0


def list_runners(args: argparse.Namespace) -> int:
    async def survey() -> int:
        async with coordinator(load_config(args.config)) as core:
            try:
                states = await core.runners(args.cluster)
            except Refused as exc:
                raise CommandError(str(exc)) from None
        for cluster, state in states:  # the terminal is the operator's: every runner with its address
            print(terminal(rich.plain(runner_line(cluster, state, private=True))))
        return 0

    return asyncio.run(survey())
