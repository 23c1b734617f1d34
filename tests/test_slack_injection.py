"""Slack text injection: what an engine says (its log, its error bodies) and an image reference are shown in
Slack, never obeyed. A run whose engine answers with `<!channel>`, `<!here>`, a disguised link and a channel
link reaches Slack's recorded calls with `&`, `<`, `>` escaped, and the terminal with the text as it was; an
image reference outside Docker's grammar (a space, `<`) is refused with one line before the allowlist's `*`
can match it, from the runner's gRPC and from a Slack command."""

from __future__ import annotations

import io
import json
from pathlib import Path

import grpc
import pytest

from bot import rich
from bot.blocks import first_error_blocks
from bot.commands.common import EventPrinter
from bot.config import ClientTls
from bot.coordinator import Coordinator
from bot.record import FirstError
from bot.rich import escaped
from bot.runner_client import open_channel
from bot.store import AsyncStore, Store
from bot.web import serving
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from runner.runs import IMAGE_REFERENCE
from tests.k3fixtures import KIMI_LAUNCH, bot_config, runner_data, running_runner
from tests.slack_api import SlackApi, command_body, post, settle, signed, slack_config

# What an engine may say: each would notify a channel, make a link whose text hides its address, or link one.
PLANTED = ["<!channel>", "<!here>", "<https://evil.example/patch|Fix applied>", "<#C0GENERAL>"]
ENGINE_SAYS = f"upstream said {PLANTED[0]} {PLANTED[1]} see {PLANTED[2]} in {PLANTED[3]} & more"


def test_escaped_text_is_shown_in_slack_and_read_back_as_it_was() -> None:
    assert escaped(ENGINE_SAYS) == (
        "upstream said &lt;!channel&gt; &lt;!here&gt; see &lt;https://evil.example/patch|Fix applied&gt; in "
        "&lt;#C0GENERAL&gt; &amp; more"
    )
    assert escaped("&lt;") == "&amp;lt;" and rich.lines([rich.Section(rich.text("&lt; <x> &"))]) == ["&lt; <x> &"]
    assert rich.mrkdwn(rich.text(rich.fence([ENGINE_SAYS]))) == f"```{escaped(ENGINE_SAYS)}```"  # code blocks too
    error = FirstError(
        "single_request", "request", ENGINE_SAYS, ENGINE_SAYS, ENGINE_SAYS, False, (ENGINE_SAYS,), ENGINE_SAYS
    )
    said = first_error_blocks(error)
    shown = json.dumps(rich.mrkdwn_blocks(said))
    assert said and not [p for p in PLANTED if p in shown]
    assert ENGINE_SAYS in "\n".join(rich.lines(said))  # the terminal prints it as it was


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai:v0.8.5",
        "host-install",
        "localhost:5000/team/vllm:k3-tools",
        "registry.example.com/vllm",
        "[::1]:5000/vllm/vllm-openai:latest",
        "vllm/vllm-openai:kimi-k3@sha256:" + "0123456789abcdef" * 4,
        "docker.io/library/ubuntu@sha256:" + "a" * 64,
    ],
)
def test_image_references_in_dockers_grammar_are_accepted(image: str) -> None:
    assert IMAGE_REFERENCE.fullmatch(image)


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai:kimi k3",
        "vllm/vllm-openai:<!channel>",
        "vllm/vllm-openai:x>y",
        "vllm/vllm-openai:<https://evil|Fix applied>",
        "vllm/VLLM-openai:latest",
        "vllm//vllm-openai",
        "vllm/vllm-openai:",
        "vllm/vllm-openai@sha256:short",
        "",
        "vllm/vllm-openai:" + "t" * 129,
    ],
)
def test_image_references_outside_the_grammar_are_refused(image: str) -> None:
    assert not IMAGE_REFERENCE.fullmatch(image)


@pytest.mark.parametrize("image", ["vllm/vllm-openai:kimi k3", "vllm/vllm-openai:<!channel>"])
async def test_the_runner_refuses_such_an_image_before_its_allowlist(
    certs: DevCerts, tmp_path: Path, image: str
) -> None:
    request = pb.StartRunRequest(run_id="r1", cluster="cluster-a", image=image, launch_argv=KIMI_LAUNCH.split())
    async with running_runner(runner_data(certs, tmp_path)) as daemon:  # allowed_images: vllm/vllm-openai:*
        tls = ClientTls(ca=certs.ca, cert=certs.bot_cert, key=certs.bot_key)
        async with open_channel(f"127.0.0.1:{daemon.port}", tls) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in pb_grpc.RunnerStub(channel).StartRun(request, timeout=10):
                    pass
        assert daemon.journal.unfinished_runs() == [] and daemon.journal.request("r1") is None
    details = caught.value.details() or ""
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not an image reference ([registry[:port]/]path[:tag][@digest]" in details and "\n" not in details
    assert "<" not in details and " k3" not in details  # the refusal cannot format a message either


def _scenario(path: Path) -> Path:
    path.write_text(
        '[deployment]\ncommand = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8"\n'
        '[[fault]]\nid = "inject"\nphase = "request"\neffect = "error_response"\n'
        f"error = {json.dumps(ENGINE_SAYS)}\nprobability = 1.0\n"
    )
    return path


async def test_engine_text_reaches_slack_escaped_and_the_terminal_as_it_was(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    runner = runner_data(certs, tmp_path / "runner", scenario=str(_scenario(tmp_path / "inject.toml")))
    terminal = io.StringIO()
    async with running_runner(runner) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        finished = await core.follow(await core.start("cluster-a", "ops"), EventPrinter(terminal, logs=True))
        store.close()
        assert finished.summary
        async with serving(slack_config(config, api), port=0) as served:
            for text in ("start cluster-a", "start cluster-a --image vllm/vllm-openai:<!channel>"):
                status, _ = await post(served, body := command_body(text), signed(body))
                assert status == 200
                await settle(served)
    assert "upstream said <!channel> <!here>" in terminal.getvalue()  # the terminal shows it as the engine said it
    runs = Store(tmp_path / "k3.db").runs()
    assert len(runs) == 2 and [r.image for r in runs].count("vllm/vllm-openai:kimi-k3") == 2  # the bad one: none
    posted = [c for c in api.calls if c.method.startswith("chat.")]
    slack = json.dumps([c.body for c in posted], ensure_ascii=False)
    assert "upstream said &lt;!channel&gt; &lt;!here&gt;" in slack  # the engine's text got there, escaped
    assert "&lt;https://evil.example/patch|Fix applied&gt;" in slack
    assert [p for p in PLANTED if p in slack] == []
    refusal = [c.body["text"] for c in posted if c.method == "chat.postEphemeral"]
    assert any("is not an image reference" in text for text in refusal), refusal
