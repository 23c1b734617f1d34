"""The hand-off report (`k3repro report RUN`, the bundle's report.md): one Markdown document, redacted."""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from bot.bundle import export_bundle, import_bundle, parse_bundle
from bot.cli import main
from bot.handoff import handoff, run_handoff
from bot.minimize import start_minimize
from bot.record import RunRecord
from bot.store import Run, Store
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from tests.k3fixtures import KIMI_LAUNCH, bot_core, finished_run, ignore_event, runner_data

SECRET = "SECRET-" + secrets.token_hex(12)
LAUNCH = f"{KIMI_LAUNCH} --api-key {SECRET} --max-num-seqs 64"


@dataclass(frozen=True)
class Crashed:
    run_id: str
    minimize_id: str
    before_minimize: str  # the report before the minimize run existed
    folder: Path

    @property
    def config(self) -> Path:
        path = self.folder / "k3repro.toml"
        path.write_text(
            f'store = "{self.folder / "k3.db"}"\n[clusters.cluster-a]\nrunners = ["127.0.0.1:1"]\nimage = "i"\n'
            'launch = "vllm serve m"\n'
        )
        return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def crashed(certs: DevCerts, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Crashed]:
    """One finished prefix-cache-crash run whose launch carries a planted API key, and its minimize run."""
    folder = tmp_path_factory.mktemp("handoff")
    runner = runner_data(certs, folder / "runner", scenario="prefix-cache-crash")
    async with bot_core(certs, folder, runner, launch=LAUNCH) as core:
        run = await finished_run(core)
        before = run_handoff(Store(folder / "k3.db"), run.run_id)
        minimize = await start_minimize(core, run.run_id, "U1")
        await core.follow(minimize, ignore_event)
        yield Crashed(run.run_id, minimize.run_id, before, folder)


def _curl_body(text: str) -> object:
    line = next(line for line in text.splitlines() if line.startswith("curl "))
    words = shlex.split(line)
    assert words[2] == "http://localhost:8000/v1/chat/completions"
    return json.loads(words[words.index("-d") + 1])


@pytest.mark.asyncio(loop_scope="module")
async def test_report_is_one_document_to_act_on(crashed: Crashed, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(crashed.config), "report", crashed.run_id]) == 0
    text = capsys.readouterr().out
    found = json.loads(
        _show_json(crashed, capsys)  # the run report's verdict line, as `show --json` gives it
    )["report"]
    assert found["verdict_line"] and f"**Verdict:** {found['verdict_line']}" in text
    # vLLM's bug-report outline, the environment from the frozen scene
    assert "### Your current environment" in text and "### 🐛 Describe the bug" in text
    for line in ("Nvidia driver version        : 580.65.06", "CUDA driver ceiling          : 13.0"):
        assert line in text
    assert "vLLM version                 : 0." in text and "NCCL version                 : 2." in text
    assert "PyTorch version" in text and "CUDA runtime version" in text and "NVIDIA GB300" in text
    # the minimize run's 1-minimal command, redacted
    assert f"minimize run `{crashed.minimize_id}`" in text
    command = text.split("```sh\n", 1)[1].split("\n", 1)[0]
    assert command.startswith("vllm serve moonshotai/Kimi-K3") and command.endswith("--enable-prefix-caching")
    assert "--max-num-seqs" not in command and "--api-key '[REDACTED:" in command
    # the fixed request as curl, its body the JSON the run sent
    body = _curl_body(text)
    assert isinstance(body, dict) and body["max_tokens"] == 16 and body["messages"][0]["content"] == "hi"
    # the first error and its context, the timings, the repeat rate, what the ladder ruled out
    assert found["first_error"]["line"] in text and "Traceback / context lines" in text
    assert "| minimal_launch | minimal_launch | gpu_detect" in text
    assert "Repeat rate: 2 of 2 attempts failed" in text
    assert "- `long_input` held:" in text and "- `concurrency` held:" in text
    assert "No isolated rerun yet." in text
    assert SECRET not in text and SECRET not in crashed.before_minimize


def _show_json(crashed: Crashed, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["--config", str(crashed.config), "show", crashed.run_id, "--json"]) == 0
    return capsys.readouterr().out


@pytest.mark.asyncio(loop_scope="module")
async def test_without_a_minimize_run_the_deployment_command_is_given(crashed: Crashed) -> None:
    text = crashed.before_minimize
    assert "The deployment's command as written" in text and f"k3repro minimize {crashed.run_id}" in text
    command = text.split("```sh\n", 1)[1].split("\n", 1)[0]
    assert "--max-num-seqs 64" in command and "--api-key '[REDACTED:" in command and SECRET not in command


@pytest.mark.asyncio(loop_scope="module")
async def test_report_to_a_file_and_an_unknown_run(
    crashed: Crashed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "handoff.md"
    assert main(["--config", str(crashed.config), "report", crashed.run_id[:15], "-o", str(out)]) == 0
    assert out.read_text().startswith("# [Bug]: ") and capsys.readouterr().out == ""
    assert main(["--config", str(crashed.config), "report", "no-such-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-run" in err


@pytest.mark.asyncio(loop_scope="module")
async def test_the_bundle_carries_the_report_and_still_imports(crashed: Crashed, tmp_path: Path) -> None:
    bundle = export_bundle(Store(crashed.folder / "k3.db"), crashed.run_id)
    report_md = bundle.members["report.md"].decode()
    assert report_md.startswith("# [Bug]: ") and "report.md" in bundle.manifest["members"]
    assert SECRET not in report_md and SECRET.encode() not in bundle.to_bytes()
    assert isinstance(_curl_body(report_md), dict)
    again = parse_bundle(bundle.to_bytes())  # import verifies the new member like every other
    imported = import_bundle(Store(tmp_path / "other.db"), again)
    assert imported.status == "completed"


def test_a_request_kept_only_as_a_hash_says_so() -> None:
    scene = {"request": {"api": "completions", "repeats": 2, "body": None, "body_sha256": "ab" * 32}}
    events = [
        pb.RunEvent(
            run_id="r1",
            seq=1,
            artifact=pb.Artifact(name="fingerprint", media_type="application/json", content=json.dumps(scene)),
        )
    ]
    run = Run(
        id="r1",
        cluster="c",
        runner="x",
        status="cancelled",
        requested_by="u",
        channel=None,
        thread_ts=None,
        image="i",
        request_json=json.dumps({"argv": ["vllm", "serve", "m", f"--hf-token={SECRET}"], "api": "completions"}),
        decision=None,
        summary="cancelled",
        created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:00Z",
        finished_at=None,
        rerun_of=None,
    )
    text = handoff(run, RunRecord.replay("r1", events))
    assert "kept only as its sha256 (`" + "ab" * 32 in text
    assert "curl -sS http://localhost:8000/v1/completions" in text and "-d @request.json" in text
    assert "The deployment's command as written" in text and SECRET not in text
    assert "No error was met." in text and "The ladder did not run." in text
