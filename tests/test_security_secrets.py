"""Planted secrets never leave in clear: every kind kernel/data/redaction.toml names, in every spelling vLLM's
parser accepts, planted in argv, the runner's env, the fixed request, the change log, the engine's log and its
error texts (a 500 whose body carries them), the sim scenario; the whole method runs on a real runner over mTLS,
from the terminal and from Slack; then the bot store, the runner's journal, an exported bundle, Slack's recorded
calls and everything the terminal printed are searched byte for byte: zero hits.

The shapes issue 28 found passing the rules (SHAPES) are each planted in the engine's output and, where one
carries such a secret, in the launch (a connector's config, which vLLM echoes in `non-default args`), the env,
the request body or the change log."""

from __future__ import annotations

import gzip
import io
import json
import secrets
import string
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from bot.bundle import export_bundle
from bot.cli import main
from bot.commands.common import EventPrinter
from bot.coordinator import Coordinator
from bot.store import AsyncStore, Store
from bot.web import serving
from kernel.tls import DevCerts
from tests.k3fixtures import bot_config, runner_data, running_runner
from tests.slack_api import SlackApi, command_body, post, settle, signed, slack_config

ALNUM = string.ascii_letters + string.digits


def _random(n: int, alphabet: str = ALNUM) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


# kind -> the secret's value; every text pattern of redaction.toml and every secret-flag spelling has one
SECRETS = {
    "hf": "hf_" + _random(34),
    "slack_bot": "xoxb-" + _random(12, string.digits) + "-" + _random(24),
    "slack_user": "xoxp-" + _random(12, string.digits) + "-" + _random(24),
    "slack_app": "xapp-1-" + _random(11).upper() + "-" + _random(20),
    "openai": "sk-proj-" + _random(40),
    "github": "ghp_" + _random(36),
    "aws": "AKIA" + _random(16, string.ascii_uppercase + string.digits),
    "authorization_bearer": "AuthBearer" + _random(20),
    "authorization_basic": "QmFzaWM" + _random(18),
    "bearer": "FreeBearer" + _random(20),
    "api_key_assign": "ApiKeyAssign" + _random(12),
    "token_colon": "TokenColon" + _random(12),
    "secret_assign": "SecretAssign" + _random(12),
    "password_colon": "PasswordColon" + _random(12),
    "passwd_assign": "PasswdAssign" + _random(12),
    "url_password": "UrlPassword" + _random(12),
    "env_assign_in_text": "EnvAssign" + _random(12),
    "flag_in_text": "FlagInText" + _random(12),
    "body_api_key": "BodyApiKey" + _random(12),
    "note_token": "NoteToken" + _random(12),
    "scenario_comment": "ScenarioComment" + _random(12),
}
FLAG_SPELLINGS = ["--api-key", "--api_key=", "--api-k", "--hf-token", "--hf_token=", "--hf-t"]
for spelling in FLAG_SPELLINGS:
    SECRETS[f"argv {spelling}"] = "FlagValue" + _random(14)
    SECRETS[f"text {spelling}"] = "FlagText" + _random(14)
ENV_NAMES = [  # recorded by the fingerprint (prefixes in fingerprint.toml), secret by redaction.toml's names
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "VLLM_API_KEY",
    "VLLM_SECRET",
    "VLLM_PASSWORD",
    "VLLM_PASSWD",
    "VLLM_KEY",
    "VLLM_CREDENTIAL",
    "VLLM_PRIVATE",
    "VLLM_AUTH",
]
for name in ENV_NAMES:
    SECRETS[f"env {name}"] = "EnvValue" + _random(14)


def _webhook_path() -> str:
    """What follows https://hooks.slack.com/services/ in a Slack webhook URL."""
    return f"T{_random(8, string.ascii_uppercase)}/B{_random(8, string.ascii_uppercase)}/{_random(24)}"


# issue 28's shapes: kind -> the secret's value (searched for), each planted in ERROR_TEXT (the engine's output)
SHAPES = {
    "api_key_list_1": "ApiKeyListOne" + _random(12),  # `non-default args: {'api_key': [...]}` of older vLLM
    "api_key_list_2": "ApiKeyListTwo" + _random(12),
    "aws_lower": "AwsLower/" + _random(20),  # `aws_secret_access_key = ...`, as ~/.aws/credentials has it
    "aws_json_key": "AwsJsonKey" + _random(12),  # `"aws_secret_access_key": "..."` (escaped in the error body)
    "aws_repr": "AwsRepr" + _random(12),  # as vLLM prints a connector: `KVTransferConfig(..., {'aws_...': '...'})`
    "azure_account_key": "AzAccountKey" + _random(24) + "+/==",
    "url_password_slash": "UrlPass/" + _random(12),
    "sas_sig": "SasSig" + _random(20) + "%2B%3D",
    "authorization_eq_basic": "QmFzaWNFcQ" + _random(16),
    "jwt": "eyJ" + _random(24) + ".eyJ" + _random(40) + "." + _random(43),
    "slack_webhook": _webhook_path(),
    "pass_var": "RedisPass" + _random(12),
    "short_hf": "hf_Q7" + _random(6),
    "pydantic_input_value": "PydanticEcho" + _random(12),
}
SHAPES_ELSEWHERE = {  # the same shapes where a launch, the env, a request or a note carries them
    "aws_connector": "AwsConnector" + _random(12),  # in --kv-transfer-config (vLLM echoes it, as aws_repr)
    "azure_in_connector": "AzConnector" + _random(24) + "==",
    "aws_body_key": "AwsBodyKey" + _random(12),
    "jwt_in_body": "eyJ" + _random(24) + ".eyJ" + _random(40) + "." + _random(43),
    "sas_in_body": "SasBody" + _random(20),
    "short_hf_in_body": "hf_Z9" + _random(7),
    "url_password_in_env": "EnvUrlPass/" + _random(12),
    "pass_in_env": "EnvPass" + _random(12),
    "webhook_in_note": _webhook_path(),
}
SECRETS.update(SHAPES)
SECRETS.update(SHAPES_ELSEWHERE)
SHAPE_ENV = {  # recorded by the fingerprint (HF_, VLLM_ prefixes): the values pass through the redactor
    "HF_ENDPOINT": f"https://mirror:{SHAPES_ELSEWHERE['url_password_in_env']}@hub.internal/",
    "VLLM_DB_PASS": SHAPES_ELSEWHERE["pass_in_env"],
}

S = SECRETS
LAUNCH_SECRETS = " ".join(
    f"{spelling}{S[f'argv {spelling}']}" if spelling.endswith("=") else f"{spelling} {S[f'argv {spelling}']}"
    for spelling in FLAG_SPELLINGS
)
CONNECTOR = json.dumps(
    {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "aws_secret_access_key": S["aws_connector"],
            "azure": f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={S['azure_in_connector']}",
        },
    },
    separators=(",", ":"),
)
LAUNCH = (
    f"vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --trust-remote-code {LAUNCH_SECRETS} "
    f"--kv-transfer-config '{CONNECTOR}'"
)
# What an engine says when a request fails: every free-text kind at once (the sim's 500 body and its log).
ERROR_TEXT = (
    f"openai.AuthenticationError: upstream refused {S['hf']} {S['slack_bot']} {S['slack_user']} {S['slack_app']} "
    f"{S['openai']} {S['github']} {S['aws']} Authorization: Bearer {S['authorization_bearer']} "
    f"bearer {S['bearer']} api_key={S['api_key_assign']} token: {S['token_colon']} secret={S['secret_assign']} "
    f"password: {S['password_colon']} passwd={S['passwd_assign']} https://ops:{S['url_password']}@hub.internal/x "
    f"HF_TOKEN={S['env_assign_in_text']} --api_key {S['flag_in_text']} "
    + " ".join(f"{spelling.rstrip('=')}={S[f'text {spelling}']}" for spelling in FLAG_SPELLINGS)
    + f" non-default args: {{'api_key': ['{S['api_key_list_1']}', '{S['api_key_list_2']}'], 'model': 'm'}}"
    + f" aws_secret_access_key = {S['aws_lower']}"
    + f' kv_connector_extra_config: {{"aws_secret_access_key": "{S["aws_json_key"]}"}}'
    + " 'kv_transfer_config': KVTransferConfig(kv_connector='LMCacheConnectorV1', kv_role='kv_both',"
    + f" kv_connector_extra_config={{'aws_secret_access_key': '{S['aws_repr']}'}}, kv_connector_module_path=None)"
    + f" DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={S['azure_account_key']};EndpointSuffix=x"
    + f" https://ops:{S['url_password_slash']}@hub.internal/x"
    + f" https://acct.blob.core.windows.net/c?sv=2022-11-02&sig={S['sas_sig']}&se=2030"
    + f" Authorization=Basic {S['authorization_eq_basic']}"
    + f" refreshed {S['jwt']} ok"
    + f" posting to https://hooks.slack.com/services/{S['slack_webhook']} failed"
    + f" REDIS_PASS={S['pass_var']} hub token {S['short_hf']} rejected"
    + f" [type=string_type, input_value='{S['pydantic_input_value']}', input_type=str]"
)
BODY = {
    "messages": [
        {"role": "user", "content": f"Authorization: Basic {S['authorization_basic']} say hi"},
        {"role": "user", "content": f"with {S['jwt_in_body']} from https://x.blob/c?sp=r&sig={S['sas_in_body']}"},
        {"role": "user", "content": f"and {S['short_hf_in_body']}"},
    ],
    "max_tokens": 16,
    "api_key": S["body_api_key"],
    "kv_transfer_params": {"aws_secret_access_key": S["aws_body_key"]},
}


def _scenario(path: Path) -> Path:
    error = json.dumps(ERROR_TEXT)
    path.write_text(
        f"# rotated token={S['scenario_comment']} last week\n"
        f'[deployment]\ncommand = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8"\n'
        f'[[fault]]\nid = "leaky"\nphase = "request"\neffect = "error_response"\nerror = {error}\nprobability = 1.0\n'
    )
    return path


def _hits(places: dict[str, bytes]) -> list[str]:
    return [
        f"{kind} in {place}" for place, data in places.items() for kind, value in S.items() if value.encode() in data
    ]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _bundle_members(data: bytes) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r:") as tar:
        out = b""
        for info in tar:
            handle = tar.extractfile(info)
            out += handle.read() if handle else b""
    return out


async def test_no_planted_secret_reaches_store_journal_bundle_slack_or_terminal(
    certs: DevCerts, tmp_path: Path, api: SlackApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ENV_NAMES:
        monkeypatch.setenv(name, S[f"env {name}"])
    for name, value in SHAPE_ENV.items():
        monkeypatch.setenv(name, value)
    scenario = _scenario(tmp_path / "leaky.toml")
    runner = runner_data(certs, tmp_path / "runner", scenario=str(scenario))
    terminal = io.StringIO()
    async with running_runner(runner) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"], launch=LAUNCH)
        cluster = config.clusters["cluster-a"]
        request = replace(cluster.request, body_json=json.dumps(BODY))
        config = replace(config, clusters={"cluster-a": replace(cluster, request=request)})
        # from the terminal, as `k3repro note` and `k3repro start` do
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        await core.note("cluster-a", f"rotated the hub token={S['note_token']}", "ops")
        await core.note("cluster-a", f"alerts to https://hooks.slack.com/services/{S['webhook_in_note']}", "ops")
        printer = EventPrinter(terminal, logs=True)
        finished = await core.follow(await core.start("cluster-a", "ops"), printer)
        store.close()
        assert finished.summary  # the whole method ran to its verdict
        # from Slack
        async with serving(slack_config(config, api), port=0) as served:
            status, _ = await post(served, body := command_body("start cluster-a"), signed(body))
            assert status == 200
            await settle(served)
    runs = Store(tmp_path / "k3.db").runs()
    assert len(runs) == 2 and all(r.status == "completed" for r in runs)
    bundles = b""
    for run in runs:
        bundles += _bundle_members(export_bundle(Store(tmp_path / "k3.db"), run.id).to_bytes())
        for args in (["show", run.id], ["show", run.id, "--logs"], ["show", run.id, "--json"], ["runs"]):
            (tmp_path / "k3.toml").write_text(
                f'store = "{tmp_path / "k3.db"}"\n[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "i"\nlaunch = "vllm serve m"\n'
            )
            assert main(["--config", str(tmp_path / "k3.toml"), *args]) == 0
    printed = capsys.readouterr()
    slack = (
        json.dumps([c.body for c in api.calls])
        + json.dumps(api.messages)
        + json.dumps(api.files, default=lambda data: data.decode("utf-8", "replace"))
    )
    places = {
        "the bot store": b"".join(_files(tmp_path).get(n, b"") for n in ("k3.db", "k3.db-wal")),
        "the runner's journal": b"".join(_files(tmp_path / "runner").values()),
        "a bundle": bundles,
        "Slack's recorded calls": slack.encode(),
        "the terminal": (terminal.getvalue() + printed.out + printed.err).encode(),
    }
    assert all(places.values()), [k for k, v in places.items() if not v]
    # the secrets really were there to leak: redacted placeholders stand where they were
    assert b"[REDACTED:" in places["a bundle"] and b"[REDACTED:" in places["the terminal"]
    assert "REDACTED" in slack
    for place in ("the bot store", "a bundle", "the terminal"):  # the engine's error text got there, redacted
        assert b"upstream refused" in places[place], place
    assert all(name.encode() in places["a bundle"] for name in ENV_NAMES)  # the env was recorded, redacted
    places.update({f"runner file {k}": v for k, v in _files(tmp_path / "runner").items()})
    assert _hits(places) == [], _hits(places)
    assert all(name.encode() in places["a bundle"] for name in SHAPE_ENV)
    assert b"kv_connector_extra_config" in places["a bundle"]  # the launch's connector config was recorded
    assert len(S) == 43 + len(SHAPES) + len(SHAPES_ELSEWHERE) == 66
