"""A real cache fault on real vLLM (the CPU build), found by the fresh-cache control and named.

vLLM CPU 0.32 with --trust-remote-code imports the model's configuration code from the HF modules cache
(HF_MODULES_CACHE/transformers_modules/<model>/<hash>/); Python reads that module's bytecode from the cache's
__pycache__. A half-written .pyc there (a full disk, a killed writer on a shared home) fails every start with
`EOFError: marshal data too short` while vLLM parses the config, a traceback that never names the cache. The
first populating import is transformers' own; only the truncation is ours.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bot.report import run_report
from kernel.fingerprint.caches import cache_specs
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from runner.stages.cache_control import SOURCE
from tests.k3fixtures import run_to_end
from tests.real_vllm_method import IMAGE, REQUEST, launch_line, runner_settings
from tests.vllm_cpu import vllm_python

pytestmark = pytest.mark.timeout(600)
REMOTE_CONFIG = '''from transformers import LlamaConfig


class TinyConfig(LlamaConfig):
    """The model's own configuration class: --trust-remote-code loads it from the HF modules cache."""

    model_type = "llama"
'''


def remote_code_model(llama: Path, root: Path) -> Path:
    """A copy of the session's model, given configuration code of its own."""
    model = Path(shutil.copytree(llama, root / llama.name))
    (model / "configuration_tiny.py").write_text(REMOTE_CONFIG)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_tiny.TinyConfig"}
    (model / "config.json").write_text(json.dumps(config, indent=2))
    return model


async def test_a_half_written_remote_code_cache_entry_is_found_by_the_fresh_cache_control(
    certs: DevCerts,
    tmp_path: Path,
    vllm_env: dict[str, str],
    vllm_models: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = remote_code_model(vllm_models["llama-4k"], tmp_path / "models")
    host = tmp_path / "host-caches"
    for spec in cache_specs():  # the host's caches, where this test can see them: none of this machine's own
        monkeypatch.setenv(spec.env, str(host / spec.name))
    loader = f"AutoConfig.from_pretrained({str(model)!r}, trust_remote_code=True)"
    populate = f"from transformers import AutoConfig; {loader}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(vllm_python()), "-c", populate], env=env, check=True, capture_output=True, timeout=120)
    (pyc,) = (host / "hf_modules").rglob("configuration_tiny.*.pyc")
    pyc.write_bytes(pyc.read_bytes()[:100])  # half-written: a valid header, its code cut short
    settings = runner_settings(tmp_path / "runner", certs)
    launch = launch_line(model, "--trust-remote-code", "--enforce-eager")
    events = await run_to_end(certs, tmp_path, settings, image=IMAGE, launch=launch, request=REQUEST)
    errors = [e.first_error for e in events if e.HasField("first_error")]
    assert errors and all("marshal data too short" in e.line for e in errors)
    report = run_report("run", events)
    check = report["checklist"]["caches_not_stale"]
    where = str(host / "hf_modules")
    assert check["state"] == "fails" and f"the host's cache is stale: clear {where}" in check["evidence"], check
    assert report["verdict_line"].startswith("a fresh hf_modules cache starts"), report["verdict_line"]
    controls = [e.launch_started for e in events if e.HasField("launch_started") and SOURCE in e.launch_started.source]
    assert controls and shlex.split(controls[-1].line)[0] == str(vllm_python())
    assert pyc.stat().st_size == 100  # the host's cache was left as it was
    assert any(r.name == "configuration_tiny.py" for r in (tmp_path / "runner" / "runs").rglob("*.py"))
    assert events[-1].run_finished.status == pb.RUN_STATUS_COMPLETED
