"""Issue 28 finding 9: what one run may keep (log caps, retention), run-id look-up, Slack status/runs scope,
deep JSON. Each hostile input is refused or bounded, never a traceback or an unbounded file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from urllib.parse import urlencode

import pytest

from bot.bundle import bounded_json, too_deep
from bot.store import RunNotFound, Store
from bot.web import serving
from kernel.retention import Retention, log_bytes
from protos import runner_pb2 as pb
from runner.config import parse_runner_config
from runner.daemon import RunnerDaemon
from runner.journal import Journal
from tests.k3fixtures import bot_config, runner_data
from tests.slack_api import SlackApi, command_body, post, signed, slack_config

LINE = "x" * 99  # 100 bytes a line with its newline
SMALL = Retention(log_head_bytes=1000, log_tail_bytes=1000)


def _chunk(run_id: str, seq: int, lines: int = 5, source: str = "minimal_launch/stdout") -> pb.RunEvent:
    return pb.RunEvent(run_id=run_id, seq=seq, log_chunk=pb.LogChunk(source=source, lines=[LINE] * lines))


def _other(run_id: str, seq: int) -> pb.RunEvent:
    return pb.RunEvent(run_id=run_id, seq=seq, stage_started=pb.StageStarted(stage=pb.STAGE_FREEZE))


def _kept(events: list[pb.RunEvent]) -> tuple[int, list[str]]:
    """The log bytes kept (notes aside) and the notes."""
    notes = [line for e in events if e.HasField("log_chunk") for line in e.log_chunk.lines if line.startswith("[k3")]
    kept = sum(log_bytes(e.log_chunk) for e in events if e.HasField("log_chunk")) - sum(len(n) + 1 for n in notes)
    return kept, notes


def _chatty(append: object, run_id: str, chunks: int = 40) -> None:
    """chunk 1 and every 7th are other events; the rest 500-byte log chunks."""
    for seq in range(1, chunks + 1):
        append(_other(run_id, seq) if seq % 7 == 1 else _chunk(run_id, seq))  # type: ignore[operator]


def _check_capped(events: list[pb.RunEvent], chunks: int = 40) -> None:
    assert [e.seq for e in events] == list(range(1, chunks + 1))  # contiguous: every seq still there
    assert sum(1 for e in events if e.HasField("stage_started")) == len(range(1, chunks + 1, 7))  # never dropped
    logs = [e for e in events if e.HasField("log_chunk")]
    kept, notes = _kept(events)
    assert kept <= SMALL.log_head_bytes + SMALL.log_tail_bytes
    assert kept == 2000  # the first two and last two chunks
    assert [len(e.log_chunk.lines) for e in logs[:2]] == [5, 5] and [len(e.log_chunk.lines) for e in logs[-2:]] == [
        5,
        5,
    ]
    dropped = len(logs) - 4
    assert notes == [
        f"[k3repro] {dropped * 5} log lines ({dropped * 500} bytes) dropped here: a run keeps the first 1000 bytes"
        " and the last 1000 bytes of its log"
    ]
    gap = logs[2:-2]
    assert all(len(e.log_chunk.lines) == 0 for e in gap[:-1]) and gap[-1].log_chunk.lines == notes
    assert all(e.log_chunk.source == "minimal_launch/stdout" for e in logs)


def test_the_journal_keeps_a_head_and_a_rolling_tail_of_log_and_every_seq(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite", SMALL)
    journal.add_run(pb.StartRunRequest(run_id="r1"))
    _chatty(journal.append, "r1")
    _check_capped(list(journal.events("r1", 0)))
    assert journal.last_seq("r1") == 40
    assert [e.seq for e in journal.events("r1", 30)] == list(range(31, 41))  # resume from a seq


def test_the_store_keeps_a_head_and_a_rolling_tail_of_log_and_every_seq(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db", SMALL)
    store.create_run("r1", "a")
    _chatty(store.add_event, "r1")
    assert store.add_event(_chunk("r1", 20)) is None  # a replayed seq is still refused once
    _check_capped(store.events("r1"))
    assert store.last_seq("r1") == 40
    reopened = Store(tmp_path / "k3.db", SMALL)  # the budget survives a restart
    reopened.add_event(_chunk("r1", 41))
    kept, notes = _kept(reopened.events("r1"))
    assert kept == 2000 and notes[0].startswith("[k3repro] 155 log lines (15500 bytes)")


def test_the_journal_forgets_runs_finished_before_retention_days(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    for run_id in ("old", "recent", "going"):
        journal.add_run(pb.StartRunRequest(run_id=run_id))
        journal.append(_chunk(run_id, 1))
    for run_id in ("old", "recent"):
        journal.append(pb.RunEvent(run_id=run_id, seq=2, run_finished=pb.RunFinished()))
    journal._db.execute("UPDATE runs SET finished_at = '2020-01-01T00:00:00.000+00:00' WHERE run_id = 'old'")
    journal._db.execute("UPDATE runs SET started_at = '2020-01-01T00:00:00.000+00:00' WHERE run_id = 'going'")
    journal.close()
    reopened = Journal(path)  # pruned at open
    assert reopened.request("old") is None and list(reopened.events("old", 0)) == []
    assert reopened.last_seq("recent") == 2 and reopened.last_seq("going") == 1  # a run going on is kept
    assert Journal(path, Retention(retention_days=0)).prune() == 0  # 0: kept for ever


def test_the_store_forgets_runs_finished_before_retention_days_with_their_slack_rows(tmp_path: Path) -> None:
    path = tmp_path / "k3.db"
    store = Store(path)
    store.create_run("old", "a")
    store.create_run("new", "b")
    store.create_run("going", "c")
    for run_id in ("old", "new", "going"):
        store.add_event(_chunk(run_id, 1))
        store.create_thread(run_id, "C1", "team")
        store.put_write(f"k-{run_id}", "C1", run_id, "chat.postMessage", "{}", coalesce=False)
    store.finish_run("old", "completed")
    store.finish_run("new", "completed")
    original = store.get_run("old")
    store.create_rerun(
        "old-rerun", original, runner="r", requested_by="u", image="i", request_json="{}",
        provider="static", placement="p", handle="", bundle_sha256="",
    )  # fmt: skip
    store.finish_run("old-rerun", "completed")
    long_ago = "2020-01-01T00:00:00.000+00:00"
    store.db.execute(
        "UPDATE runs SET finished_at = ?, created_at = ? WHERE id IN ('old', 'old-rerun')", [long_ago, long_ago]
    )
    store.db.execute("UPDATE run_events SET received_at = ? WHERE run_id IN ('old', 'going')", [long_ago])
    store.db.conn.commit()
    store.close()
    again = Store(path)  # pruned at open
    assert {run.id for run in again.runs()} == {"new", "going"}
    for table in ("run_events", "slack_threads", "slack_outbox", "log_budgets", "reruns"):
        ids = {row["run_id"] for row in again.db.table(table).rows}
        assert not ids & {"old", "old-rerun"}, table
    assert again.thread("new") is not None and again.last_seq("going") == 1


def test_a_run_id_prefix_is_characters_not_like_wildcards(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    for run_id, cluster in (("ab_1", "a"), ("abx1", "b"), ("a%z", "c")):
        store.create_run(run_id, cluster)
        store.finish_run(run_id, "completed")
    assert store.get_run("ab_").id == "ab_1"  # '_' was any one character: ambiguous with abx1
    assert store.get_run("a%").id == "a%z"  # '%' was anything: ambiguous with all three
    for typed in ("%", "_b", "%1", "a_x"):
        with pytest.raises(RunNotFound):
            store.get_run(typed)


# --- deep JSON: the Slack signature before any parsing, and a bound on depth ---


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_an_unsigned_deeply_nested_slack_post_is_a_401_before_any_parsing(tmp_path: Path, api: SlackApi) -> None:
    config = slack_config(bot_config(None, tmp_path / "k3.db", ["127.0.0.1:9"]), api)
    async with serving(config, port=0) as served:
        answers = []
        for body, content_type, headers in (
            (_deep(100_000), "application/json", {}),
            (urlencode({"payload": _deep(100_000)}), "application/x-www-form-urlencoded", {}),
            (_deep(100_000), "application/json", {"X-Slack-Request-Timestamp": "not-a-number"}),
        ):
            answers.append(await post(served, body, {"Content-Type": content_type, **headers}))
        # signed (Slack would never send it): refused in one line, never a traceback
        body = urlencode({"payload": _deep(100_000)})
        signed_deep = await post(served, body, {"Content-Type": "application/x-www-form-urlencoded", **signed(body)})
        await served.bot.idle()
    assert [status for status, _ in answers] == [401, 401, 401]
    assert signed_deep == (400, "the request's JSON nests deeper than 64 levels")
    assert [c.method for c in api.calls] == ["auth.test"]


def test_json_depth_is_bounded_without_recursion_in_bundle_json() -> None:
    assert too_deep(_deep(1_000_000)) and too_deep("[" * 100_000) and too_deep("{" * 65)  # unclosed count
    assert not too_deep(_deep(64)) and too_deep(_deep(65))
    assert not too_deep('{"a": "' + "[{" * 100 + '", "b": [[1]], "c": "\\\\\\"]"}')  # strings do not count
    assert too_deep('{"a": "\\\\", "b": ' + _deep(65) + "}")  # an escaped backslash ends no string early
    with pytest.raises(ValueError, match="deeper than 64"):
        bounded_json(_deep(65))
    assert isinstance(bounded_json(_deep(64)), list)


# --- /k3repro status and runs: a cluster's runs, in its channels, to its operators ---


async def test_status_and_runs_show_only_this_channels_clusters_to_their_operators(
    tmp_path: Path, api: SlackApi
) -> None:
    config = slack_config(bot_config(None, tmp_path / "k3.db", ["127.0.0.1:9"]), api)
    other = replace(config.clusters["cluster-a"], name="cluster-b", channels=("C-B",), operators=("U-B",))
    config = replace(config, clusters={**config.clusters, "cluster-b": other})
    store = Store(tmp_path / "k3.db")
    for run_id, cluster in (("run-a1", "cluster-a"), ("run-b1", "cluster-b"), ("run-b2", "cluster-b")):
        store.create_run(run_id, cluster)
        store.create_thread(run_id, "C-OPS" if cluster == "cluster-a" else "C-B", "team")
        store.finish_run(run_id, "completed")  # (an active one would be resumed, with no runner to reach)
    store.close()
    answers: dict[tuple[str, str, str], str] = {}
    async with serving(config, port=0) as served:
        for text, user, channel in (
            ("runs", "U-OPS", "C-OPS"),
            ("status", "U-OPS", "C-OPS"),
            ("status run-a1", "U-OPS", "C-OPS"),
            ("status run-b1", "U-OPS", "C-OPS"),
            ("status run-", "U-OPS", "C-OPS"),  # would be ambiguous over both clusters
            ("runs", "U-B", "C-B"),
            ("runs", "U-OPS", "C-B"),  # an operator of cluster-a, in cluster-b's channel
            ("runs", "U-B", "C-OPS"),
            ("status", "U-SOMEONE", "C-ELSEWHERE"),
            ("status run-a1", "U-SOMEONE", "C-ELSEWHERE"),
        ):
            body = command_body(text, user=user, channel=channel)
            await post(served, body, signed(body))
            await served.bot.idle()
            answers[text, user, channel] = api.called("chat.postEphemeral")[-1].body["text"]
    assert "run-a1" in answers["runs", "U-OPS", "C-OPS"] and "run-b" not in answers["runs", "U-OPS", "C-OPS"]
    assert answers["status", "U-OPS", "C-OPS"].startswith("no run is active")
    assert "run-a1" in answers["status run-a1", "U-OPS", "C-OPS"]
    assert answers["status run-b1", "U-OPS", "C-OPS"] == "⛔ no run 'run-b1'"
    assert "run-a1" in answers["status run-", "U-OPS", "C-OPS"]
    assert "run-b1" in answers["runs", "U-B", "C-B"] and "run-b2" in answers["runs", "U-B", "C-B"]
    assert "run-a1" not in answers["runs", "U-B", "C-B"] and "C-OPS" not in answers["runs", "U-B", "C-B"]
    refused = [
        answers[k] for k in answers if k[1:] in (("U-OPS", "C-B"), ("U-B", "C-OPS"), ("U-SOMEONE", "C-ELSEWHERE"))
    ]
    assert len(refused) == 4
    assert all(a.startswith("⛔ `status` and `runs` show a cluster's runs in its channels") for a in refused)
    assert not any("run-" in a for a in refused)


def test_the_store_lists_and_finds_runs_of_given_clusters_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    store.create_run("run-a", "a")
    store.create_run("run-b", "b")
    assert [r.id for r in store.runs(10, ("running",), ("a",))] == ["run-a"]
    assert [r.id for r in store.runs(10, (), ("b", "c"))] == ["run-b"]
    assert store.runs(10, (), ()) == []
    assert store.get_run("run-", ("a",)).id == "run-a"
    with pytest.raises(RunNotFound):
        store.get_run("run-b", ("a",))


def test_the_caps_and_retention_are_configured_in_both_configs(tmp_path: Path) -> None:
    from bot.config import parse_bot_config
    from kernel.toml_reader import ConfigError
    from runner.config import parse_runner_config

    keys = {"log_head_mib": 1, "log_tail_mib": 0.5, "retention_days": 7}
    runner = parse_runner_config(
        {"cluster": "a", "allowed_images": ["x/*"], **keys}, base=tmp_path, origin="runner.toml"
    )
    bot = parse_bot_config({"store": "k3.db", **keys}, base=tmp_path, origin="k3repro.toml")
    assert runner.retention == bot.retention == Retention(1024 * 1024, 512 * 1024, 7)
    assert parse_bot_config({}, base=tmp_path, origin="k3repro.toml").retention == Retention()
    with pytest.raises(ConfigError, match="retention_days must be 0 or more"):
        parse_bot_config({"retention_days": -1}, base=tmp_path, origin="k3repro.toml")
    store = Store(tmp_path / "k3.db")
    store.use_retention(bot.retention)
    assert store.retention.log_tail_bytes == 512 * 1024


async def test_the_runner_and_the_bot_apply_their_configured_retention(tmp_path: Path) -> None:
    data = {**runner_data(None, tmp_path / "runner"), "log_head_mib": 1, "log_tail_mib": 2, "retention_days": 0}
    daemon = RunnerDaemon(parse_runner_config(data, base=tmp_path, origin="runner.toml"))
    try:
        assert daemon.journal.retention == daemon.config.retention
        assert daemon.config.retention.retention_days == 0
    finally:
        daemon.journal.close()
        daemon._lock.close()
