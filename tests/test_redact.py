from __future__ import annotations

from runner.redact import MASK, redactor


def test_tokens_in_text_are_masked() -> None:
    r = redactor()
    line = "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 curl -H 'Authorization: Bearer abc.def.ghi123' https://u:pw@h/x"
    out = r.line(line)
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in out
    assert "abc.def.ghi123" not in out
    assert "u:pw@" not in out and f"u:{MASK}@" in out
    assert r.line("xoxb-1234567890-abcdefghij posted") == f"{MASK} posted"


def test_ordinary_log_lines_are_untouched() -> None:
    line = "(EngineCore pid=68) INFO 11-30 09:00:00 [core.py:93] GPU KV cache size: 1,234,560 tokens"
    assert redactor().line(line) == line


def test_secret_flags_and_env_are_masked() -> None:
    r = redactor()
    assert r.argv(["vllm", "serve", "m", "--api-key", "s3cret", "--hf-token=hf_x", "--port", "8000"]) == [
        "vllm", "serve", "m", "--api-key", MASK, f"--hf-token={MASK}", "--port", "8000",
    ]  # fmt: skip
    env = r.env({"HF_TOKEN": "x", "SLACK_SIGNING_SECRET": "y", "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO"})
    assert env == {"HF_TOKEN": MASK, "SLACK_SIGNING_SECRET": MASK, "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO"}
