"""`k3repro` as a well-kept CLI (issue 24, item 4): a closed pipe and Ctrl-C end quietly and truthfully, `watch`
of an ended run prints its result, `show` links reruns and minimize runs, `runs` says each run's kind, no Slack
markup or placeholder reaches the terminal, `show --json` nests JSON as JSON, `--help` loads no command, `start`
takes Slack's options, and a SIGKILLed demo leaves no engine and no private key behind."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot import cli
from bot.bundle import export_bundle, import_bundle
from bot.store import Store
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from runner.engines.process import process_groups
from tests.k3fixtures import KIMI_LAUNCH, bot_core, finished_run, runner_data, running_runner

BIN = Path(sys.executable).parent
RERUN, MINIMIZE, CANCELLED = "20990101-000001-aaaa", "20990101-000002-bbbb", "20990101-000003-cccc"


def _config(certs: DevCerts, folder: Path, port: int = 9) -> Path:
    path = folder / "k3.toml"
    path.write_text(
        f'store = "{folder / "k3.db"}"\n'
        f'[tls]\nca = "{certs.ca}"\ncert = "{certs.bot_cert}"\nkey = "{certs.bot_key}"\n'
        f'[clusters.cluster-a]\nrunners = ["127.0.0.1:{port}"]\n'
        f'image = "vllm/vllm-openai:kimi-k3"\nlaunch = "{KIMI_LAUNCH}"\nprofile = "kimi-k3"\n'
    )
    return path


@dataclass(frozen=True)
class Stored:
    config: Path
    run_id: str  # the demo scenario's run, ended (completed, decision continue)
    imported: str  # its bundle, imported back


@pytest.fixture(scope="module")
def stored(certs: DevCerts, tmp_path_factory: pytest.TempPathFactory) -> Stored:
    """A store with an ended run, an isolated rerun of it (verdict reproduced), a minimize run of it, a run
    cancelled from Slack (its reason names the user as a mention) and the run's bundle imported."""
    folder = tmp_path_factory.mktemp("stored")

    async def build() -> str:
        async with bot_core(certs, folder, runner_data(certs, folder / "runner", scenario="demo")) as core:
            return (await finished_run(core)).run_id

    run_id = asyncio.run(build())
    store = Store(folder / "k3.db")
    original = store.get_run(run_id)
    store.create_rerun(
        RERUN, original, runner="127.0.0.1:9", requested_by="U1", image=original.image, request_json="{}",
        provider="static", placement="127.0.0.1:9", handle="", bundle_sha256="0" * 64,
    )  # fmt: skip
    store.record_verdict(RERUN, "reproduced", "{}")
    store.finish_run(RERUN, "completed", "reproduced")
    store.create_run(MINIMIZE, "cluster-a", request_json=json.dumps({"minimize_of": run_id}))
    store.finish_run(MINIMIZE, "completed", "1-minimal: --enable-prefix-caching")
    store.create_run(CANCELLED, "cluster-a", requested_by="U1")
    store.finish_run(CANCELLED, "cancelled", "cancelled by <@U1>")
    imported = import_bundle(store, export_bundle(store, run_id)).id
    store.close()
    return Stored(_config(certs, folder), run_id, imported)


def _k3repro(*argv: str | Path, **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BIN / "k3repro", *argv], capture_output=True, text=True, timeout=60, check=False, **options)


def _main(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- a closed pipe, Ctrl-C ---


def test_a_closed_pipe_ends_every_printing_command_quietly(stored: Stored, tmp_path: Path) -> None:
    """`k3repro … | head -1`: the reader is gone before the command writes (its pipe's read end closed first):
    no traceback, the exit a shell gives a command SIGPIPE ended."""
    log = tmp_path / "vllm.log"
    log.write_text("(EngineCore pid=1) ERROR 05-12 02:46:01 [core.py:1] RuntimeError: CUDA error: out of memory\n")
    scene = tmp_path / "scene.json"
    scene.write_text(_k3repro("fingerprint", "--json").stdout)
    config = ("--config", stored.config)
    commands = [
        (*config, "runs"),
        (*config, "show", stored.run_id),
        (*config, "show", stored.run_id, "--json"),
        ("analyze", log),
        ("check", "--baseline", "kimi-k3", "--fingerprint", scene),
        ("diff", scene, scene),
        ("demo",),
    ]
    for argv in commands:
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run(
                [BIN / "k3repro", *argv], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, check=False
            )
        finally:
            os.close(write)
        assert (done.returncode, done.stderr) == (141, ""), argv


def test_ctrl_c_in_the_demo_is_one_line_that_says_what_happened() -> None:
    demo = subprocess.Popen(
        [BIN / "k3repro", "demo", "--speed", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert demo.stdout is not None
    first = demo.stdout.readline()
    workdir = Path(re.search(r"store (\S+)", first).group(1)).parent  # type: ignore[union-attr]
    while not demo.stdout.readline().startswith("run "):
        pass
    demo.send_signal(signal.SIGINT)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == 130
    assert err.strip() == (
        "k3repro demo: interrupted; its runner and engine were stopped and its temporary folder removed"
    )
    assert not workdir.exists()


def test_ctrl_c_while_start_reads_the_log_says_nothing_started(
    stored: Stored, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.commands import start

    def interrupted(path: str) -> pb.FirstError:
        raise KeyboardInterrupt

    monkeypatch.setattr(start, "_deployment_error", interrupted)
    code, out, _ = _main(capsys, "--config", stored.config, "start", "cluster-a", "--log", tmp_path / "big.log")
    assert (code, out.strip()) == (130, "interrupted: nothing started")


async def test_ctrl_c_once_a_run_exists_names_it_and_how_to_follow_it(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="demo", speed=0.2)) as daemon:
        start = await asyncio.create_subprocess_exec(
            BIN / "k3repro", "--config", _config(certs, tmp_path, daemon.port), "start", "cluster-a",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert start.stdout is not None
        first = (await asyncio.wait_for(start.stdout.readline(), 60)).decode()
        run_id = first.split()[1]
        start.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(start.communicate(), 60)
    assert start.returncode == 130 and b"Traceback" not in err
    assert out.decode().strip().splitlines()[-1] == (
        f"detached: the run goes on as {run_id}; follow it with `k3repro watch {run_id}`"
    )


# --- watch, show, runs ---


def test_watch_of_an_ended_run_prints_its_result(stored: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "--config", stored.config, "watch", stored.run_id)
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == f"run {stored.run_id} has ended; its result:"
    assert "Verdict: continue" in out and stored.run_id in lines[1]


def test_an_unknown_run_keeps_its_quotes(stored: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["watch", "abc-d"], ["show", "abc-d"], ["bundle", "export", "abc-d", "-o", "x.tgz"]):
        code, _, err = _main(capsys, "--config", stored.config, *argv)
        assert (code, err) == (2, "k3repro: no run 'abc-d'\n"), argv


def test_show_of_a_run_lists_its_reruns_and_minimize_runs(stored: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "--config", stored.config, "show", stored.run_id)
    assert code == 0
    assert out.splitlines()[1:3] == [
        f"isolated rerun {RERUN} (static) · verdict reproduced",
        f"minimize run {MINIMIZE} · completed · 1-minimal: --enable-prefix-caching",
    ]
    _, out, _ = _main(capsys, "--config", stored.config, "show", RERUN)
    assert out.splitlines()[1] == f"isolated rerun of {stored.run_id} · verdict reproduced"
    _, out, _ = _main(capsys, "--config", stored.config, "show", MINIMIZE)
    assert out.splitlines()[1] == f"minimize run of {stored.run_id}"
    _, out, _ = _main(capsys, "--config", stored.config, "show", RERUN, "--json")
    assert json.loads(out)["links"] == {
        "kind": "rerun", "rerun_of": stored.run_id, "verdict": "reproduced", "reruns": [], "minimize_runs": [],
    }  # fmt: skip


def test_runs_has_a_kind_column_and_no_slack_markup(stored: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "--config", stored.config, "runs")
    kinds = {line.split()[0]: line.split()[3] for line in out.splitlines()}  # id, cluster, status, kind
    assert code == 0
    assert kinds == {
        stored.run_id: "run", RERUN: "rerun", MINIMIZE: "minimize", CANCELLED: "run", stored.imported: "imported",
    }  # fmt: skip
    cancelled = next(line for line in out.splitlines() if line.startswith(CANCELLED))
    assert cancelled.endswith("cancelled by @U1") and "<@" not in out


def test_show_names_the_run_where_the_blocks_say_run(stored: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _main(capsys, "--config", stored.config, "show", stored.run_id)
    assert f"k3repro show {stored.run_id} --json prints it" in out
    assert not re.search(r"\bRUN\b", out)


def test_show_json_nests_json_as_json(stored: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _main(capsys, "--config", stored.config, "show", stored.run_id, "--json")
    shown = json.loads(out)
    assert isinstance(shown["run"]["request_json"], dict) and shown["run"]["request_json"]["argv"]

    def artifacts(value: Any) -> list[dict[str, Any]]:
        if isinstance(value, list):
            return [a for item in value for a in artifacts(item)]
        if not isinstance(value, dict):
            return []
        found = [value] if "mediaType" in value else []
        return found + [a for item in value.values() for a in artifacts(item)]

    json_artifacts = [a for a in artifacts(shown["events"]) if a["mediaType"] == "application/json"]
    assert json_artifacts and all(isinstance(a["content"], dict | list) for a in json_artifacts)
    fingerprint = next(a for a in json_artifacts if a["name"] == "fingerprint")
    assert fingerprint["content"]["sha256"]


# --- --help, start's options ---


def test_help_loads_no_command_and_no_store() -> None:
    code = (
        "import sys\nfrom bot.cli import build_parser\nbuild_parser().format_help()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('bot.commands', 'bot.store', 'grpc', 'sqlite_utils', 'runner'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert _k3repro("--help").stdout.startswith("usage: k3repro [-h] [--config CONFIG] COMMAND ...")


def test_the_help_table_is_the_registrys() -> None:
    from bot.config import CONFIG_ENV, DEFAULT_CONFIG

    assert f"bot config (default: ${CONFIG_ENV} or ./{DEFAULT_CONFIG})" == cli.CONFIG_HELP
    for name in cli.COMMANDS:
        parser = cli.build_parser(name)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {action.dest: action.help for action in sub._choices_actions}
        assert helps == {n: op.help("cli") for n, op in cli.COMMANDS.items()}, name
        assert sub.choices[name]._actions[0].option_strings == ["-h", "--help"], name  # the real parser


def test_start_takes_slacks_options(capsys: pytest.CaptureFixture[str]) -> None:
    from bot.slack.commands import OPERATIONS

    start = cli.build_parser("start")
    args = start.parse_args(["start", "cluster-a", "--profile", "kimi-k3", "--image", "vllm/vllm-openai:v2"])
    assert (args.profile, args.image) == ("kimi-k3", "vllm/vllm-openai:v2")
    assert [o.name for o in OPERATIONS["start"].options_on("slack")] == ["profile", "image"]
    with pytest.raises(SystemExit):
        start.parse_args(["start", "--help"])
    assert "--profile P" in capsys.readouterr().out


async def test_start_image_reaches_the_run(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner")) as daemon:
        config = _config(certs, tmp_path, daemon.port)
        code = await asyncio.to_thread(
            cli.main, ["--config", str(config), "start", "cluster-a", "--image", "vllm/vllm-openai:other"]
        )
    store = Store(tmp_path / "k3.db")
    (run,) = store.runs()
    store.close()
    assert code == 0 and run.image == "vllm/vllm-openai:other"


# --- a killed demo ---


def test_a_killed_demo_leaves_no_engine_and_no_private_key() -> None:
    demo = subprocess.Popen(
        [BIN / "k3repro", "demo", "--speed", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert demo.stdout is not None
    workdir = Path(re.search(r"store (\S+)", demo.stdout.readline()).group(1)).parent  # type: ignore[union-attr]
    run_id = ""
    while not run_id:
        if found := re.match(r"run (\S+) ·", demo.stdout.readline()):
            run_id = found.group(1)
    deadline = time.monotonic() + 60
    while not process_groups({run_id}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_groups({run_id}), "the demo's engine never started"
    assert list(workdir.rglob("*key*"))  # the demo's private keys
    demo.kill()
    demo.communicate(timeout=10)
    deadline = time.monotonic() + 10
    while (process_groups({run_id}) or workdir.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_groups({run_id})
    assert not workdir.exists()
