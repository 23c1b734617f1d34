"""`minimize`: ddmin over a deployment's optional flags, on vllm-sim through the real runner and bot core."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from bot.blocks import ACTION_MINIMIZE
from bot.cli import main
from bot.coordinator import Coordinator, StartedRun
from bot.minimize import start_minimize
from bot.record import RunRecord, StageResult
from bot.refusal import Refused
from bot.store import Store
from kernel.tls import DevCerts
from kernel.vllm_cli import parse_launch_command
from protos import runner_pb2 as pb
from runner.stages.minimize import Trial, Unit, confidence_of, ddmin, tries_needed, units_of, with_units
from tests.k3fixtures import KIMI_LAUNCH, bot_core, finished_run, ignore_event, runner_data
from tests.slack_api import (
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
)


def _units(names: str) -> tuple[Unit, ...]:
    return tuple(Unit(name, ()) for name in names)


def _test_of(
    needed: set[str], unresolved: frozenset[frozenset[str]] = frozenset()
) -> tuple[Callable[[tuple[Unit, ...]], Awaitable[Trial]], list[frozenset[str]]]:
    """A test that fails when every flag in `needed` is there; sets in `unresolved` are neither."""
    tested: list[frozenset[str]] = []

    async def test(subset: tuple[Unit, ...]) -> Trial:
        key = frozenset(u.name for u in subset)
        tested.append(key)
        if key in unresolved:
            return Trial.UNRESOLVED
        return Trial.FAIL if needed <= key else Trial.PASS

    return test, tested


@pytest.mark.parametrize("needed", ["b", "be", "aeh", "", "abcdefgh"])
async def test_ddmin_finds_the_flags_a_failure_needs(needed: str) -> None:
    test, tested = _test_of(set(needed))
    found = await ddmin(_units("abcdefgh"), test)
    assert {u.name for u in found} == set(needed)
    assert len(tested) < 2 ** len("abcdefgh")  # not every subset


async def test_ddmin_is_one_minimal_when_some_sets_are_unresolved() -> None:
    # vLLM refuses every set with `c` but without `d` (a flag that needs another): such sets are unresolved
    unresolved = frozenset(
        frozenset(s) for n in range(9) for s in itertools.combinations("abcdefgh", n) if "c" in s and "d" not in s
    )
    test, _ = _test_of({"c"}, unresolved)
    found = await ddmin(_units("abcdefgh"), test)
    names = {u.name for u in found}
    assert names == {"c", "d"}  # taking d away is unresolved, so it stays
    for name in names:  # 1-minimal: no single flag can go
        assert await test(tuple(u for u in found if u.name != name)) != "fail"


def test_how_many_tries_a_flaky_failure_needs() -> None:
    assert tries_needed(1.0, 0.95, 5) == 1
    assert tries_needed(0.5, 0.95, 5) == 5  # 1 - 0.5^5 = 0.97
    assert tries_needed(0.8, 0.95, 5) == 2  # 1 - 0.2^2 = 0.96
    assert tries_needed(0.1, 0.95, 5) == 5  # capped
    assert confidence_of(0.5, 5) == pytest.approx(0.96875)


def test_units_are_the_optional_flags_and_the_default_on_features() -> None:
    command = parse_launch_command(
        [*KIMI_LAUNCH.split(), "-cc.mode=none", "--max-num-seqs", "4", "-cc.level=3", "--no-enable-prefix-caching"]
    )
    units = {u.name: u.text for u in units_of(command)}
    assert "--model" not in units and "--tensor-parallel-size" not in units and "--trust-remote-code" not in units
    assert units["--compilation-config"] == "-cc.mode=none -cc.level=3"  # every occurrence of a flag is one unit
    assert units["--enable-prefix-caching"] == "--enable-prefix-caching --no-enable-prefix-caching"
    bare = parse_launch_command(["vllm", "serve", "m", "--max-num-seqs", "4"])
    assert {u.name: u.text for u in units_of(bare)}["--enable-prefix-caching"] == "--enable-prefix-caching"
    assert with_units(bare, ()).argv() == ["vllm", "serve", "m", "--no-enable-prefix-caching"]


# --- end to end: the method finds the trigger, minimize shrinks the flags ---------------------------------------

LAUNCH = KIMI_LAUNCH + " --max-num-seqs 64 --gpu-memory-utilization 0.92"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def crashed(certs: DevCerts, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Crashed]:
    """One runner and one finished prefix-cache-crash run whose ladder named its trigger: the tests below shrink
    it each their own way (the bot core, the CLI), one after the other."""
    folder = tmp_path_factory.mktemp("crashed")
    runner = runner_data(certs, folder / "runner", scenario="prefix-cache-crash")
    async with bot_core(certs, folder, runner, launch=LAUNCH) as core:
        yield Crashed(core, await finished_run(core), folder)


@dataclass(frozen=True)
class Crashed:
    core: Coordinator
    original: StartedRun
    folder: Path  # its store is folder/k3.db


@pytest.mark.asyncio(loop_scope="module")
async def test_minimize_shrinks_a_prefix_cache_crash_to_its_flag(crashed: Crashed) -> None:
    core, original = crashed.core, crashed.original
    started = await start_minimize(core, original.run_id, "U1")
    assert started.request.minimize.original_run_id == original.run_id
    assert list(started.request.launch_argv) == LAUNCH.split()
    assert started.request.request == original.request.request  # what the original sent, its probes sized on it
    finished = await core.follow(started, ignore_event)
    record = RunRecord.replay(started.run_id, await core.store.call(Store.events, started.run_id))
    audit = await core.store.call(Store.audit_entries)
    assert finished.status == pb.RUN_STATUS_COMPLETED
    assert [(s.stage, s.status) for s in record.steps if isinstance(s, StageResult)] == [
        ("freeze", "ok"),
        ("minimize", "ok"),
    ]
    result = json.loads(record.artifacts["minimal_failing_command"])
    assert result["flags"] == ["--enable-prefix-caching"]
    assert result["command"].endswith("--enable-prefix-caching") and "--max-num-seqs" not in result["command"]
    assert set(result["irrelevant"]) >= {"--max-num-seqs 64", "--kv-cache-dtype fp8", "--enable-auto-tool-choice"}
    assert result["confirmed_on_real"] and result["one_minimal"] and result["repeat_rate"] == 1.0
    assert result["failure"]["phase"] == "request" and result["failure"]["category"] == "request_error"
    assert result["launches"] == finished.launches >= len(result["tests"])
    # tests ran on proxies where one preserves the failure; the result rests on a real launch
    assert any(source.startswith("minimize/") and source.endswith("/proxy") for source in _sources(record))
    assert any(t["real"] and t["verdict"] == "fail" for t in result["tests"])
    # the full set first (it must fail), then the search: every verdict is one of three
    assert result["tests"][0]["verdict"] == "fail" and len(result["tests"][0]["flags"]) == len(result["irrelevant"]) + 1
    assert {t["verdict"] for t in result["tests"]} <= {"fail", "pass", "unresolved"}
    assert any(e.action == "minimize" and e.target == original.run_id for e in audit)


def _sources(record: RunRecord) -> set[str]:
    return set(record.logs)


async def test_minimize_refuses_a_run_without_a_trigger(certs: DevCerts, tmp_path: Path) -> None:
    runner = runner_data(certs, tmp_path / "runner", scenario="healthy")
    async with bot_core(certs, tmp_path, runner) as core:
        healthy = await finished_run(core)
        runs_before = await core.store.call(Store.runs, 10)
        with pytest.raises(Refused, match="no ladder step that triggered"):
            await start_minimize(core, healthy.run_id, "U1")
        assert await core.store.call(Store.runs, 10) == runs_before  # nothing was started or stored


def test_minimize_of_an_unknown_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--config", str(_config_file(tmp_path, tmp_path / "k3.db")), "minimize", "no-such-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no-such-run" in err and "Traceback" not in err


def _config_file(tmp_path: Path, store: Path) -> Path:
    path = tmp_path / "k3repro.toml"
    path.write_text(
        f'store = "{store}"\n[clusters.cluster-a]\nrunners = ["127.0.0.1:1"]\nimage = "i"\nlaunch = "vllm serve m"\n'
    )
    return path


# --- Slack: the card's button and the command ----------------------------------------------------------------


async def test_the_minimize_button_starts_a_run_with_its_own_thread(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    launch = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --trust-remote-code --kv-cache-dtype fp8 --enable-prefix-caching"
    async with slack_bot(certs, tmp_path, api, scenario="prefix-cache-crash", launch=launch) as served:
        await post(served, body := command_body("start cluster-a"), signed(body))
        await settle(served)
        store = Store(tmp_path / "k3.db")
        original = store.runs()[0].id
        card = parent_of(api)
        assert card is not None and ACTION_MINIMIZE in block_text(card)  # the ladder named a trigger
        click = action_body(action_payload(ACTION_MINIMIZE, original, trigger="t-minimize"))
        await post(served, click, signed(click))
        await settle(served)
        await post(served, body := command_body(f"minimize {original}", user="U-NOBODY"), signed(body))
        await settle(served)
    runs = store.runs()
    assert len(runs) == 2 and json.loads(runs[0].request_json)["minimize_of"] == original
    minimize_run = runs[0].id
    cards = [m for m in api.messages.values() if m["channel"] == "C-OPS" and "thread_ts" not in m]
    shrunk = next(m for m in cards if m["metadata"]["event_payload"]["run_id"] == minimize_run)
    assert ACTION_MINIMIZE not in block_text(shrunk)  # a minimize run has no ladder of its own
    assert f"*k3repro minimize run* `{minimize_run}` of `{original}`" in block_text(shrunk)
    last = next(m for m in api.thread(shrunk["ts"]) if m.get("reply_broadcast"))
    assert "1-minimal failing command" in block_text(last) and "--enable-prefix-caching" in block_text(last)
    assert "irrelevant to the failure" in block_text(last) and "--kv-cache-dtype fp8" in block_text(last)
    thread = [block_text(m) for m in api.thread(shrunk["ts"])]
    assert any(f"a minimize run settles none: see run `{original}`" in t for t in thread)
    assert not any("prefix_caching_isolated" in t for t in thread)  # not the method's ten items, all pending
    assert any("--enable-prefix-caching" in t and "1 of" in t for t in thread)
    told = [block_text(m) for m in api.thread(card["ts"])]
    assert any(f"minimize run `{minimize_run}` started by <@U-OPS>" in t for t in told)
    # its result reaches the original's thread (and, broadcast, the channel), not "every stage succeeded"
    assert any("1-minimal failing command" in t and "--enable-prefix-caching" in t for t in told)
    assert "Minimize result" in block_text(last) and "every stage succeeded" not in block_text(last)
    refused = api.called("chat.postEphemeral")[-1].body["text"]
    assert "not an operator" in refused and len(store.runs()) == 2
    actions = [(e.actor, e.action) for e in reversed(store.audit_entries())]
    assert actions == [("U-OPS", "start"), ("U-OPS", "start"), ("U-OPS", "minimize")]


@pytest.mark.asyncio(loop_scope="module")
async def test_k3repro_minimize_prints_the_failing_command(
    crashed: Crashed, certs: DevCerts, capsys: pytest.CaptureFixture[str]
) -> None:
    core, original, config = crashed.core, crashed.original, crashed.folder / "k3.toml"
    config.write_text(
        f'store = "{crashed.folder / "k3.db"}"\n'
        f'[tls]\nca = "{certs.ca}"\ncert = "{certs.bot_cert}"\nkey = "{certs.bot_key}"\n'
        f"[clusters.cluster-a]\nrunners = {json.dumps(list(core.config.cluster('cluster-a').runners))}\n"
        f'image = "vllm/vllm-openai:kimi-k3"\nlaunch = {json.dumps(LAUNCH)}\n'
    )
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["--config", str(config), "minimize", original.run_id])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "minimize run " in out and f"of {original.run_id}" in out
    assert (
        "1-minimal failing command" in out
        and "--trust-remote-code --load-format fastsafetensors --enable-prefix-caching" in out
    )
    assert "irrelevant to the failure" in out and "Traceback" not in out
