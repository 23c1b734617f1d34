from __future__ import annotations

import json
import re

import pytest

from kernel.redact import KEY_ENV, PLACEHOLDER, Redactor, printable, redactor
from protos import runner_pb2 as pb

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
OPENAI = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6"
SLACK = "xoxb-" + "1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx"
GITHUB = "ghp_" + "0123456789abcdefghijABCDEFGHIJ012345"


def secrets_left(text: str) -> list[str]:
    return [
        s
        for s in (HF, OPENAI, SLACK, GITHUB, "hunter2-prod", "s3cr3t-pa55", "eyJhbGciOiJIUzI1NiJ9.payload")
        if s in text
    ]


def test_tokens_in_log_lines_are_masked() -> None:
    r = redactor()
    lines = [
        f"(APIServer pid=1) INFO 11-30 09:00:00 [api_server.py:1] args: hf_token='{HF}', api_key='{OPENAI}'",
        f"curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload' -H 'x-slack: {SLACK}' https://x",
        "HUGGING_FACE_HUB_TOKEN=" + HF + " git clone https://oauth2:" + GITHUB + "@github.com/org/repo",
        "connecting to postgres://k3repro:hunter2-prod@db.internal:5432/runs",
        "password: s3cr3t-pa55",
    ]
    out = "\n".join(r.line(line) for line in lines)
    assert secrets_left(out) == []
    assert "postgres://k3repro:[REDACTED:" in out and "@db.internal:5432/runs" in out
    assert out.count("[REDACTED:") >= 7


def test_ordinary_log_lines_are_untouched() -> None:
    line = "(EngineCore pid=68) INFO 11-30 09:00:00 [core.py:93] GPU KV cache size: 1,234,560 tokens"
    assert redactor().line(line) == line


def test_secret_flags_and_env_are_masked() -> None:
    r = redactor()
    argv = r.argv(["vllm", "serve", "m", "--api-key", "hunter2-prod", f"--hf-token={HF}", "--port", "8000"])
    assert argv[:4] == ["vllm", "serve", "m", "--api-key"] and argv[6:] == ["--port", "8000"]
    assert PLACEHOLDER.fullmatch(argv[4]) and re.fullmatch(r"--hf-token=\[REDACTED:[0-9a-f]{8}\]", argv[5])
    env = r.env(
        {
            "HF_TOKEN": HF,
            "SLACK_SIGNING_SECRET": "abc",
            "VLLM_API_KEY": "hunter2-prod",
            "AWS_SECRET_ACCESS_KEY": "x",
            "NCCL_SOCKET_IFNAME": "eth0",
            "NCCL_IB_PKEY": "0x8001",  # an InfiniBand partition key is configuration, not a secret
            "OPENAI_APIKEY": "hunter2-prod",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "HTTPS_PROXY": "http://me:s3cr3t-pa55@proxy:3128",
        }
    )
    assert secrets_left(str(env)) == []
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["NCCL_IB_PKEY"] == "0x8001"
    assert all(PLACEHOLDER.fullmatch(env[k]) for k in ("HF_TOKEN", "SLACK_SIGNING_SECRET", "VLLM_API_KEY"))


def test_placeholders_are_stable_so_redacted_scenes_still_diff() -> None:
    r = redactor()
    first, again, other = r.mask(HF), r.env({"HF_TOKEN": HF})["HF_TOKEN"], r.mask(HF + "x")
    assert first == again != other
    # the same secret in argv, env and a log line gets the same placeholder
    assert r.argv(["--hf-token", HF])[1] == first and first in r.line(f"token={HF}")
    # redacting twice changes nothing (fingerprints pass through the redactor more than once)
    assert r.line(r.line(f"Authorization: Bearer {OPENAI}")) == r.line(f"Authorization: Bearer {OPENAI}")
    assert r.env(r.env({"HF_TOKEN": HF})) == r.env({"HF_TOKEN": HF})


def test_a_shared_key_makes_placeholders_equal_across_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "site-key")
    redactor.cache_clear()
    try:
        a = redactor()
        redactor.cache_clear()
        b = redactor()
        assert a is not b and a.mask(HF) == b.mask(HF)
    finally:
        redactor.cache_clear()
    plain = Redactor(a.env_names, a.secret_flags, a.text, b"another key")
    assert plain.mask(HF) != a.mask(HF)  # without the key, the placeholder says nothing about the secret


@pytest.mark.parametrize(
    "spelling", ["--api-key", "--api_key", "--api-k", "--api", "--hf-token", "--hf_token", "--hf-t", "--hf_t"]
)
def test_every_spelling_vllm_accepts_of_a_secret_flag_is_masked(spelling: str) -> None:
    r = redactor()
    secret = "hunter2-prod"
    assert secret not in " ".join(r.argv(["vllm", "serve", "m", spelling, secret]))
    assert secret not in " ".join(r.argv(["vllm", "serve", "m", f"{spelling}={secret}"]))
    for text in (
        f"{spelling} {secret}",
        f"{spelling}={secret}",
        f'["{spelling}", "{secret}"]',
        f"'{spelling}': '{secret}'",
    ):
        assert secret not in r.line(text), text
    assert r.argv(["--host", "h", "--hf-overrides", "{}"]) == ["--host", "h", "--hf-overrides", "{}"]


def test_json_is_redacted_by_structure_and_kept_byte_for_byte_when_clean() -> None:
    r = redactor()
    clean = '{"argv": ["vllm", "serve", "m"],  "max_tokens": 16}'
    assert r.json_text(clean) == clean
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "api_key": "hunter2-prod"})
    doc = json.dumps({"argv": ["vllm", "--api_key", "s3cr3t-pa55"], "request": body, "HF_TOKEN": "x"})
    out = r.json_text(doc)
    assert secrets_left(out) == [] and "REDACTED" in json.loads(json.loads(out)["request"])["api_key"]
    assert PLACEHOLDER.fullmatch(json.loads(out)["HF_TOKEN"])


def test_a_protobuf_message_is_redacted_in_every_string_field() -> None:
    event = pb.RunEvent(
        run_id="r",
        request_result=pb.RequestResult(error=f"401: Authorization: Bearer {OPENAI}", warnings=[f"token={HF}"]),
    )
    redacted = redactor().message(event)
    assert secrets_left(str(redacted)) == [] and redacted.run_id == "r"
    assert OPENAI in event.request_result.error  # a copy: the original is left as it was


def test_terminal_control_sequences_are_removed() -> None:
    assert printable("ok\x1b[2J\x1b]0;pwned\x07 \x1b[31mred\x1b[0m\x08\ttab\n") == "ok red\ttab\n"


# issue 28: shapes the rules missed; each text -> the secret in it (a value the redactor must not leave)
SHAPES = {
    "api_key list (older vLLM)": (
        "non-default args: {'api_key': ['ListKeyOne', 'ListKeyTwo'], 'model': 'm'}",
        "ListKeyOne",
        "ListKeyTwo",
    ),
    "api_key list cut off": ("non-default args: {'api_key': ['CutOffKey1', 'CutOffK", "CutOffKey1", "CutOffK"),
    "api_key JSON list": ('{"api_key": ["JsonListKey1"]}', "JsonListKey1"),
    "aws lower-case": ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    "aws in a connector's config": (
        '--kv-transfer-config {"kv_connector":"X","kv_connector_extra_config":{"aws_secret_access_key":"AwsJson99"}}',
        "AwsJson99",
    ),
    "aws in vLLM's config repr": ("kv_connector_extra_config={'aws_secret_access_key': 'AwsRepr99'}", "AwsRepr99"),
    "azure AccountKey": (
        "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Az+Key/Val==;EndpointSuffix=core.windows.net",
        "Az+Key/Val==",
    ),
    "azure SharedAccessKey": ("Endpoint=sb://x/;SharedAccessKeyName=n;SharedAccessKey=SbKey123=", "SbKey123="),
    "URL password with /": ("https://ops:Pass/Word9@hub.internal/x", "Pass/Word9"),
    "URL password, no user": ("redis://:RedisPw77@cache:6379/0", "RedisPw77"),
    "SAS sig=": ("https://a.blob.core.windows.net/c?sv=2022-11-02&sig=SasSig%2B9%3D&se=x", "SasSig%2B9%3D"),
    "Authorization=Basic": ("Authorization=Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    "bare JWT": (
        "got eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U back",
        "eyJzdWIiOiIxMjM0NTY3ODkwIn0",
    ),
    "Slack webhook": ("https://hooks.slack.com/services/T0AB12CD3/B0AB12CD3/aBcDeFgHiJkLmNoPqRsTuVwX", "aBcDeFgHiJ"),
    "*_PASS variable": ("export REDIS_PASS=RedisPass12 DB_PASSPHRASE=Phrase34", "RedisPass12", "Phrase34"),
    "short hf_ token": ("token is hf_AbC123xyz", "hf_AbC123xyz"),
    "pydantic input_value": ("[type=int_parsing, input_value='PydanticEcho1', input_type=str]", "PydanticEcho1"),
    "pydantic input_value cut off": ("[type=value_error, input_value='PydanticCutOf", "PydanticCutOf"),
    "escaped JSON in text": (
        r"body: {\"api_key\": \"EscKey123\", \"HF_TOKEN\": \"EscEnv123\", \"aws_secret_access_key\": \"EscAws1\"}",
        "EscKey123",
        "EscEnv123",
        "EscAws1",
    ),
    "escaped JSON argv and list": (
        r"{\"argv\": [\"--api-key\", \"EscFlag12\"], \"api_key\": [\"EscList1\", \"EscList2\"]}",
        "EscFlag12",
        "EscList1",
        "EscList2",
    ),
    "escaped Authorization": (r"\"Authorization\": \"Basic EscBasic99\"", "EscBasic99"),
    "AWS temporary key id": ("ASIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE"),
    "Google API key": ("key AIzaSyA-1234567890abcdefghijklmnopqrstu", "AIzaSyA-1234567890abcdefghijklmnopqrstu"),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_is_masked_once_and_stays_masked(shape: str) -> None:
    text, *values = SHAPES[shape]
    r = redactor()
    out = r.json_text(text) if text.startswith("{") else r.line(text)
    assert [v for v in values if v in out] == [] and "[REDACTED:" in out, out
    assert r.line(out) == out  # idempotent: a redacted text redacted again is unchanged
    assert r.argv(["vllm", text])[1] == r.line(text)


@pytest.mark.parametrize(
    "text",
    [
        "non-default args: {'api_key': '***', 'hf_token': '***', 'hf_overrides': {}, 'served_model_name': ['m']}",
        "hf_overrides hf_config_path hf_token hf_transfer",
        "GET http://127.0.0.1:8000/v1/models and docker://registry.io:5000/vllm/vllm-openai@sha256:0123abcd",
        "{'max_num_batched_tokens': 512, 'tokens': [1, 2, 3], 'prompt_tokens_details': None}",
        "VLLM_ENABLE_PREGRAD_PASSES=1 TORCHINDUCTOR_DISABLED_PASSES=x BYPASS=1",
        "[type=value_error, input_value=ArgsKwargs((), {'tensor_parallel_size': 2}), input_type=ArgsKwargs]",
        "https://hooks.slack.com/ is documented at https://api.slack.com/messaging/webhooks",
    ],
)
def test_configuration_that_looks_like_those_shapes_is_left_alone(text: str) -> None:
    assert redactor().line(text) == text


def test_the_digest_is_keyed() -> None:
    r = redactor()
    other = Redactor(r.env_names, r.secret_flags, r.text, b"another key")
    assert r.digest(b"request") == r.digest(b"request") != other.digest(b"request")
    assert len(r.digest(b"request")) == 64
