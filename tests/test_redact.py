from __future__ import annotations

import json
import re

import pytest

from protos import runner_pb2 as pb
from runner.redact import KEY_ENV, PLACEHOLDER, Redactor, printable, redactor

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
