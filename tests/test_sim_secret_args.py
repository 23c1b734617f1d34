"""vllm-sim's `non-default args` line hides what vLLM 0.32 hides: real vLLM (the CPU build the suite uses) and
the simulator are started with the same `--api-key`, `--hf-token` and a connector config holding a secret, and
their lines are compared; the secrets vLLM prints anyway (a connector's extra config) are the redactor's."""

from __future__ import annotations

import ast
import re
import subprocess

from kernel.redact import redactor
from kernel.vllm_cli import parse_serve_args
from tests.vllm_cpu import ENV, SERVER_MODULE, vllm_python
from vllm_sim.settings import settings_from

API_KEY = "ApiKeyNotInLogs0451"
HF_TOKEN = "hf_ShortTok3n"
AWS = "AwsSecretInConnector9"
CONNECTOR = '{"kv_connector": "X", "kv_role": "kv_both", "kv_connector_extra_config": {"aws_secret_access_key": "%s"}}'
FLAGS = ["--api-key", API_KEY, "--hf-token", HF_TOKEN, "--kv-transfer-config", CONNECTOR % AWS]
LINE = re.compile(r"non-default args: (\{.*\})$", re.MULTILINE)


def _sim_args() -> dict[str, object]:
    settings = settings_from(parse_serve_args(["/nonexistent/model", *FLAGS]), ["auto"])
    text = f"non-default args: {settings.non_default_args!r}"
    match = LINE.search(text)
    assert match
    return dict(ast.literal_eval(match.group(1)))


def _real_line() -> str:
    """Real vLLM logs `non-default args` before it looks at the model, then fails on the missing one."""
    out = subprocess.run(
        [str(vllm_python()), "-m", SERVER_MODULE, "--model", "/nonexistent/model", *FLAGS],
        env={**ENV, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    match = LINE.search(out.stdout + out.stderr)
    assert match, (out.stdout + out.stderr)[-2000:]
    return match.group(0)


def test_the_sim_prints_api_key_and_hf_token_as_vllm_does() -> None:
    real = _real_line()
    sim = _sim_args()
    assert sim["api_key"] == sim["hf_token"] == "***"
    for key in ("api_key", "hf_token"):
        assert f"'{key}': '***'" in real
    assert API_KEY not in real and HF_TOKEN not in real
    # the connector's own config is printed verbatim by both: only the redactor stands between it and a thread
    assert AWS in real and AWS in repr(sim)
    assert AWS not in redactor().line(real) and AWS not in redactor().line(repr(sim))


def test_the_list_form_older_vllm_prints_is_redacted() -> None:
    """vLLM before `redact_sensitive_args` printed `--api-key`'s list (several keys may be given)."""
    line = f"non-default args: {{'api_key': ['{API_KEY}', 'Second{API_KEY}'], 'model': 'm', 'hf_token': '{HF_TOKEN}'}}"
    out = redactor().line(line)
    assert API_KEY not in out and HF_TOKEN not in out
    assert out.count("[REDACTED:") == 3 and "'model': 'm'" in out
