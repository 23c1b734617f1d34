"""vllm-sim, the stand-in for `vllm serve`: run as a real subprocess, read as vLLM's log would be read."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kernel.vllm_cli import parse_serve_args
from vllm_sim.catalog import catalog
from vllm_sim.conditions import RequestView, When
from vllm_sim.prefix_cache import PrefixCache
from vllm_sim.scenario import STARTUP_PHASES, Fault, load_scenario
from vllm_sim.settings import UsageError, settings_from
from vllm_sim.sizing import compute_facts
from vllm_sim.startup import script

SPEED = "1000"  # a whole start-up (about 106 simulated seconds) in about 0.1 s
PREFIX = re.compile(r"^\((?:APIServer|EngineCore|Worker_TP\d+) pid=\d+\) ")
LOGGER_LINE = re.compile(
    r"^\((?:APIServer|EngineCore|Worker_TP\d+) pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+\.py:\d+\] "
)
UVICORN_LINE = re.compile(r"^INFO:     ")  # vLLM 0.32: uvicorn's lines carry no process prefix
ENGINE_WRAPPER = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}"
)

# The exact text vLLM / torch / NCCL print for each catalogued start-up failure (shared/reference/vllm.md §2).
ERROR_TEXT = {
    "nccl_unhandled_system_error": "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "nccl_dmabuf_unsupported": "Call to mlx5dv_reg_dmabuf_mr failed with error Unknown error 524",
    "driver_too_old": "RuntimeError: The NVIDIA driver on your system is too old (found version 13000).",
    "free_memory_less_than_desired": "on startup is less than desired GPU memory utilization (0.92, 264.96 GiB).",
    "weight_load_oom": "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization",
    "no_kv_cache_memory": "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
    "max_model_len_exceeds_kv_cache": "KV cache is needed, which is larger than the available KV cache memory",
    "cudagraph_capture_oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU ",
    "address_in_use": "OSError: [Errno 98] Address already in use",
    "stale_jit_kernel_symbol": "OSError: fused_moe_sm100.so: undefined symbol: _ZN10flashinfer7cutlass20CutlassMoeFCRunnerSm100E",
    "stale_jit_kernel_illegal_access": "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
    "world_size_exceeds_gpus": "Value error, World size (",
}
# Per phase: a line written before a failure in that phase, and one it never gets to.
PHASE_BOUNDS = {
    "gpu_detect": ("Resolved architecture", "Starting to load model"),
    "weight_load": ("Starting to load model", "Available KV cache memory"),
    "engine_init": ("Model loading took", "Starting vLLM server on"),
    "api_listen": ("non-default args", "Resolved architecture"),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Output:
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [*self.stdout.split("\n")[:-1], *self.stderr.split("\n")[:-1]]


class Sim:
    """A vllm-sim process writing to files (no pipe can fill up and stall it)."""

    def __init__(self, tmp: Path, args: list[str], scenario: str | None, speed: str, port: int) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._out, self._err = tmp / f"sim-{self.port}.out", tmp / f"sim-{self.port}.err"
        env = {"PATH": "/usr/bin:/bin", "VLLM_SIM_SPEED": speed}
        if scenario:
            env["VLLM_SIM_SCENARIO"] = scenario
        argv = [sys.executable, "-m", "vllm_sim", "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        with self._out.open("wb") as out, self._err.open("wb") as err:
            self.process = subprocess.Popen(argv, stdout=out, stderr=err, env=env)

    def output(self, timeout: float = 15) -> Output:
        code = self.process.wait(timeout)
        # bytes, not text mode: universal newlines would turn tqdm's \r into line breaks
        return Output(code, self._out.read_bytes().decode(), self._err.read_bytes().decode())

    def stdout_now(self) -> str:
        return self._out.read_bytes().decode()

    async def ready(self, http: aiohttp.ClientSession, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self._err.read_bytes().decode()[-2000:]
            try:
                async with http.get(f"{self.url}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.02)
        raise AssertionError("vllm-sim never became healthy")

    def stop(self) -> Output:
        self.process.send_signal(signal.SIGTERM)
        return self.output()


StartSim = Callable[..., Sim]


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[StartSim]:
    started: list[Sim] = []

    def start(args: list[str], scenario: str | None = None, speed: str = SPEED, port: int = 0) -> Sim:
        process = Sim(tmp_path, args, scenario, speed, port)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.process.poll() is None:
            process.process.kill()
            process.process.wait()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def write_scenario(tmp_path: Path, text: str) -> str:
    """A scenario file; the deployment, which the simulator does not use, is added when the text has none."""
    path = tmp_path / "scenario.toml"
    deployment = "" if "[deployment]" in text else '\n[deployment]\ncommand = "vllm serve org/model"\n'
    path.write_text(text + deployment)
    return str(path)


def assert_in_order(text: str, markers: list[str]) -> None:
    position = 0
    for marker in markers:
        found = text.find(marker, position)
        assert found >= 0, f"{marker!r} missing or out of order"
        position = found + len(marker)


def assert_vllm_format(out: Output) -> None:
    for line in out.stdout.split("\n")[:-1]:
        assert LOGGER_LINE.match(line) or UVICORN_LINE.match(line), line
    for line in out.stderr.split("\n")[:-1]:
        assert PREFIX.match(line) or UVICORN_LINE.match(line), line


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    return sum(values)


async def chat(http: aiohttp.ClientSession, url: str, **body: object) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        return response.status, await response.json()


# --- start-up log -----------------------------------------------------------------------------------


async def test_healthy_tp8_startup_log_and_sigterm(sim: StartSim, http: aiohttp.ClientSession) -> None:
    process = sim(["moonshotai/Kimi-K3", "--tensor-parallel-size", "8", "--trust-remote-code"])
    await process.ready(http)
    out = process.stop()

    assert out.code == 0
    assert_vllm_format(out)
    assert_in_order(
        out.stdout,
        [
            "version 0.32.0\r\n",
            "model   moonshotai/Kimi-K3\r\n",
            "non-default args: {'host': '127.0.0.1', 'port': ",
            "'model': 'moonshotai/Kimi-K3', 'tensor_parallel_size': 8, 'trust_remote_code': True}",
            "Resolved architecture: ",
            "Using max model len 131072",
            "(EngineCore pid=",
            "Initializing a V1 LLM engine (v0.32.0) with config: model='moonshotai/Kimi-K3'",
            "DP group leader: ",
            "(Worker_TP0 pid=",
            "world_size=8 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:",
            "(Worker_TP7 pid=",
            "world_size=8 rank=7 local_rank=7",
            "vLLM is using nccl==2.28.3",
            "Starting to load model moonshotai/Kimi-K3...",
            "Loading weights took ",
            "Model loading took ",
            "torch.compile took ",
            "Available KV cache memory: ",
            "GPU KV cache size: ",
            "Graph capturing finished in ",
            "init engine (profile, create kv cache, warmup model) took ",
            "Supported tasks: ['generate']",
            f"Starting vLLM server on {process.url}",
            "Available routes are:",
            "Route: /v1/chat/completions, Methods: POST",
            "[shutdown] API server: shutdown triggered",
            "[shutdown] EngineCore: exiting busy loop",
            "[shutdown] Executor: waiting for worker exit count=8",
            "[shutdown] API server: shutting down FastAPI HTTP server",
        ],
    )
    assert re.search(
        r"GPU KV cache size: \d{1,3}(,\d{3})+ tokens, Maximum concurrency for 131,072 tokens per request: [\d.]+x",
        out.stdout,
    )
    assert_in_order(
        out.stderr,
        [
            "Loading safetensors checkpoint shards: 100% Completed | 4/4",
            "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 51/51",
            "INFO:     Started server process [",
            "INFO:     Waiting for application startup.",
            "INFO:     Application startup complete.",
            "INFO:     Shutting down",
            "INFO:     Application shutdown complete.",
        ],
    )
    pids = {m.group(1): m.group(2) for m in re.finditer(r"\((\S+) pid=(\d+)\)", out.stdout)}
    assert len(pids) == 10 and len(set(pids.values())) == 10  # API server, engine core, 8 workers


async def test_sigterm_during_startup_exits_0_promptly(sim: StartSim) -> None:
    process = sim(["some/model"], speed="1")  # a two-minute start-up
    deadline = time.monotonic() + 10
    while "non-default args" not in process.stdout_now() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    started = time.monotonic()
    out = process.stop()
    assert out.code == 0
    assert time.monotonic() - started < 3
    assert "[shutdown] API server: shutdown triggered" in out.stdout
    assert "Application startup complete." not in out.stderr


# --- the command line and the scenario --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["serve", "m", "--foo", "--tensor-parallel-size", "2"], "vllm: error: unrecognized arguments: --foo\n"),
        (["serve", "m", "--port", "eighty"], "vllm serve: error: argument --port: invalid int value: 'eighty'\n"),
        (
            ["serve", "m", "--kv-cache-dtype", "int3"],
            "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'int3'",
        ),
        (["launch", "m"], "vllm: error: argument subparser: invalid choice: 'launch'"),
    ],
)
def test_command_line_refused_like_argparse(args: list[str], error: str) -> None:
    done = subprocess.run([sys.executable, "-m", "vllm_sim", *args], capture_output=True, text=True, timeout=15)
    assert done.returncode == 2
    assert done.stdout == ""  # refused before any log line
    assert done.stderr.startswith("usage: vllm ")
    assert error in done.stderr


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[fault]]\nphase = "gpu_detect"\nerror = "cosmic_ray"\n', "fault[0]: unknown error 'cosmic_ray'"),
        ('[[fault]]\nphase = "request"\nerror = "driver_too_old"\n', "happens in phase gpu_detect, not request"),
        ('[host]\ngpu_count = "eight"\n', "[host]: 'gpu_count' must be an integer"),
        (
            '[[fault]]\nphase = "gpu_detect"\nerror = "driver_too_old"\nwhen = { flags_present = ["--nope"] }\n',
            "'--nope' is not a vllm serve flag",
        ),
        ("[host\n", "Expected"),
        ('[deployment]\nimage = "x"\n', "[deployment]: missing key 'command'"),
        ('[deployment]\ncommand = "vllm serve m --turbo"\n', "'command': unrecognized arguments: --turbo"),
        ('[deployment]\ncommand = "vllm serve m"\nrequest = { max_tokens = 4 }\n', "messages (chat) or prompt"),
        ('[[fault]]\nerror = "x: y"\nseverity = 3\n', "fault[0]: unknown key 'severity'"),
        ('[[fault]]\nphase = "weight_load"\neffect = "error_response"\n', "only applies to phase request"),
        ('[[fault]]\nphase = "gpu_detect"\neffect = "explode"\n', "effect must be one of crash, hang"),
        ('[[fault]]\nphase = "gpu_detect"\nwhen = { concurrency_min = 2 }\n', "concurrency_min only applies"),
        ("[[fault]]\nprobability = 1.5\n", "'probability' must be between 0 and 1"),
        ('[[fault]]\nwhen = { flag_values = { "--max-model-len" = ">long" } }\n', "compares with >: give a number"),
        ('[[fault]]\nwhen = { flag_values = { "--enforce-eager" = "1" } }\n', "--enforce-eager takes no value"),
        ('[[fault]]\nid = "a"\n[[fault]]\nid = "a"\n', "fault id 'a' is used twice"),
        ('[host]\ncuda_driver_version = "13"\n', "'cuda_driver_version' must read like \"13.0\""),
    ],
)
def test_invalid_scenario_is_one_line_exit_2(tmp_path: Path, text: str, problem: str) -> None:
    path = write_scenario(tmp_path, text)
    done = subprocess.run(
        [sys.executable, "-m", "vllm_sim", "serve", "m"],
        capture_output=True,
        text=True,
        timeout=15,
        env={"VLLM_SIM_SCENARIO": path, "VLLM_SIM_SPEED": SPEED},
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"vllm-sim: {path}: ")
    assert problem in done.stderr


@pytest.mark.parametrize("name", ["demo", "healthy"])
def test_builtin_scenarios_are_valid(name: str) -> None:
    path = Path(__file__).parent.parent / "vllm_sim" / "data" / "scenarios" / f"{name}.toml"
    scenario = load_scenario(str(path), catalog().phases())
    assert scenario.description and scenario.host.gpu_count == 8


def test_demo_minimal_launch_dies_of_nccl_on_one_rank(sim: StartSim) -> None:
    args = [
        "moonshotai/Kimi-K3",
        "--tensor-parallel-size",
        "8",
        "--trust-remote-code",
        "--load-format",
        "fastsafetensors",
    ]
    out = sim(args, str(Path(__file__).parent.parent / "vllm_sim/data/scenarios/demo.toml")).output()
    assert out.code == 1
    root = [line for line in out.stdout.splitlines() if "RuntimeError: NCCL error: unhandled system error" in line]
    assert root and root[0].startswith("(Worker_TP3 pid=")
    assert "Starting to load model" not in out.stdout
    assert out.stderr.rstrip().endswith(ENGINE_WRAPPER)


# --- faults -----------------------------------------------------------------------------------------


STARTUP_ERRORS = sorted(key for key, spec in catalog().errors.items() if spec.phase in STARTUP_PHASES)


def test_every_startup_error_has_a_test_text() -> None:
    assert sorted(ERROR_TEXT) == STARTUP_ERRORS


# NCCL (multiproc-only) faults cannot happen with one GPU, so they are only run with two.
FAULT_CASES = [
    (error, tp)
    for error in STARTUP_ERRORS
    for tp in ("2", "1")
    if tp == "2" or "multiproc" not in catalog().errors[error].only
]


@pytest.mark.parametrize(("error", "tp"), FAULT_CASES)
def test_catalogued_fault_stops_in_its_phase(sim: StartSim, tmp_path: Path, error: str, tp: str) -> None:
    spec = catalog().errors[error]
    phase = spec.phase
    scenario = write_scenario(
        tmp_path,
        f'[[fault]]\nphase = "{phase}"\nerror = "{error}"\nrank = {int(tp) - 1}\n',
    )
    out = sim(["org/model", "--tensor-parallel-size", tp], scenario).output()

    assert out.code == 1
    assert_vllm_format(out)
    text = out.stdout + out.stderr
    assert ERROR_TEXT[error] in text
    assert "Application startup complete." not in out.stderr
    reached, never = PHASE_BOUNDS[phase]
    assert reached in out.stdout and never not in out.stdout
    if spec.raised_in == "api":  # the API server dies before any engine process exists
        failing = "APIServer"
        assert "(EngineCore pid=" not in text
    else:
        failing = "Worker_TP1" if tp == "2" and spec.raised_in == "worker" else "EngineCore"
        assert ENGINE_WRAPPER in out.stderr
        assert text.index(ERROR_TEXT[error]) < text.index(ENGINE_WRAPPER) or ERROR_TEXT[error] in out.stdout
    assert any(line.startswith(f"({failing} pid=") and ERROR_TEXT[error] in line for line in out.lines)


def test_cudagraph_fault_does_not_happen_with_enforce_eager(sim: StartSim, tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, '[[fault]]\nphase = "engine_init"\nerror = "cudagraph_capture_oom"\n')
    process = sim(["org/model", "--enforce-eager"], scenario)
    out = process.stop() if _wait_for(process, "Starting vLLM server on") else process.output()
    assert out.code == 0, out.stdout[-2000:]
    assert "CUDA out of memory" not in out.stdout + out.stderr
    assert "torch.compile" not in out.stdout and "Capturing CUDA graphs" not in out.stderr


def _wait_for(process: Sim, marker: str, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.process.poll() is None:
        if marker in process.stdout_now():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize(
    ("args", "host", "expected"),
    [
        (
            ["--max-model-len", "4M"],
            "",
            "To serve at least one request with the model's max seq len (4194304), (512.00 GiB KV cache is needed, "
            "which is larger than the available KV cache memory (245.36 GiB). Based on the available memory, "
            "the estimated maximum model length is 2009984.",
        ),
        ([], "foreign_memory_mib = 40960", "Free memory on device cuda:0 (248.00/288.00 GiB) on startup is less than"),
        ([], "gpu_memory_mib = 8192", "torch.OutOfMemoryError: CUDA out of memory."),
        (["-tp", "16"], "", "World size (16) is larger than the number of available GPUs (8) in this node."),
    ],
)
def test_memory_that_does_not_add_up_fails_by_itself(
    sim: StartSim, tmp_path: Path, args: list[str], host: str, expected: str
) -> None:
    out = sim(["org/model", *args], write_scenario(tmp_path, f"[host]\n{host}\n")).output()
    assert out.code == 1
    assert expected in out.stdout + out.stderr


def test_port_in_use_fails_before_the_engine_starts(sim: StartSim) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        out = sim(["org/model"], port=holder.getsockname()[1]).output()
    finally:
        holder.close()
    assert out.code == 1
    assert "(APIServer pid=" in out.stderr and "OSError: [Errno 98] Address already in use" in out.stderr
    assert "sock.bind(addr)" in out.stderr
    assert "Initializing a V1 LLM engine" not in out.stdout
    assert "Application startup complete." not in out.stderr


async def test_request_fault_gives_500_then_503_then_exit(
    sim: StartSim, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    scenario = write_scenario(
        tmp_path,
        "[timings]\nengine_death_exit = 1000.0\n"
        '[[fault]]\nphase = "request"\nerror = "engine_dead_illegal_memory_access"\nrank = 1\n'
        "when = { prompt_tokens_min = 30 }\n",
    )
    process = sim(["org/model", "-tp", "2"], scenario)
    await process.ready(http)
    status, _ = await chat(http, process.url, messages=[{"role": "user", "content": "short"}], max_tokens=4)
    assert status == 200
    status, body = await chat(http, process.url, messages=[{"role": "user", "content": "long " * 40}], max_tokens=4)
    assert status == 500
    assert body == {
        "error": {
            "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    async with http.get(f"{process.url}/health") as response:
        assert response.status == 503
    out = process.output()
    assert out.code == 1
    assert_vllm_format(out)
    assert_in_order(
        out.stdout,
        [
            "(Worker_TP1 pid=",
            "WorkerProc hit an exception.",
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
            "EngineCore encountered a fatal error.",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
            '"POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error',
        ],
    )
    assert "INFO:     Application shutdown complete." in out.stderr  # 0.32 prints no "Finished server process"


# The fault of issue #5's scenario contract, verbatim.
CONTRACT_EXAMPLE = """
[deployment]
command = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --trust-remote-code --load-format fastsafetensors --enable-prefix-caching --max-model-len 262144 --enable-auto-tool-choice --tool-call-parser kimi_k2"
image = "vllm/vllm-openai:kimi-k3"
request = { max_tokens = 64, messages = [{ role = "user", content = "Say hello." }] }

[host]
driver_version = "580.65.06"
cuda_driver_version = "13.0"
gpu_name = "NVIDIA GB300"
gpu_count = 8
gpu_memory_mib = 196608
foreign_memory_mib = 0
seed = 1

[[fault]]
id = "prefix-ima"
phase = "request"
effect = "crash"
error = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
traceback = true
probability = 1.0
[fault.when]
flags_present = ["--enable-prefix-caching"]
flags_absent = ["--enforce-eager"]
flag_values = { "--max-model-len" = ">131072", "--tensor-parallel-size" = "8" }
prompt_tokens_min = 8000
repeated_prefix = true
tools = false
concurrency_min = 1
driver_below = "580"
foreign_memory = true
"""


def test_the_contract_example_loads_as_written(tmp_path: Path) -> None:
    scenario = load_scenario(write_scenario(tmp_path, CONTRACT_EXAMPLE), catalog().phases())
    assert scenario.deployment is not None and scenario.deployment.argv[:3] == ("vllm", "serve", "moonshotai/Kimi-K3")
    assert (scenario.deployment.image, scenario.deployment.api) == ("vllm/vllm-openai:kimi-k3", "chat")
    assert scenario.deployment.request == {"max_tokens": 64, "messages": [{"role": "user", "content": "Say hello."}]}
    assert (scenario.host.gpu_memory_gib, scenario.host.cuda_version_number, scenario.host.seed) == (192.0, 13000, 1)
    (fault,) = scenario.faults
    assert (fault.id, fault.phase, fault.effect, fault.traceback) == ("prefix-ima", "request", "crash", True)
    assert fault.when.flag_values == (("--max-model-len", ">131072"), ("--tensor-parallel-size", "8"))
    assert (fault.when.driver_below, fault.when.foreign_memory, fault.when.concurrency_min) == ("580", True, 1)


def _long_prompt(words: int, tail: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "incident " * words + tail}]


async def test_an_error_given_as_text_crashes_the_engine_with_vllms_wrappers(
    sim: StartSim, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    scenario = write_scenario(
        tmp_path,
        "[timings]\nengine_death_exit = 1000.0\n"
        '[[fault]]\nerror = "torch.AcceleratorError: CUDA error: misaligned address {sic}"\nrank = 1\n'
        '[fault.when]\nflags_present = ["--enable-prefix-caching"]\nprompt_tokens_min = 100\nrepeated_prefix = true\n',
    )
    process = sim(["org/model", "-tp", "2", "--enable-prefix-caching"], scenario)
    await process.ready(http)
    status, _ = await chat(http, process.url, messages=_long_prompt(150, "first"), max_tokens=4)
    assert status == 200  # long, but its prefix is new
    status, _ = await chat(http, process.url, messages=_long_prompt(10, "short"), max_tokens=4)
    assert status == 200  # its prefix repeats, but it is short
    status, _ = await chat(http, process.url, messages=_long_prompt(150, "second"), max_tokens=4)
    assert status == 500
    process.process.send_signal(signal.SIGTERM)
    out = process.output()
    assert_vllm_format(out)
    assert_in_order(
        out.stdout,
        [
            "(Worker_TP1 pid=",
            "WorkerProc hit an exception.",
            "torch.AcceleratorError: CUDA error: misaligned address {sic}",  # verbatim: no format fields
            "EngineCore encountered a fatal error.",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        ],
    )


async def test_an_error_response_fails_the_request_and_the_server_goes_on(
    sim: StartSim, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    scenario = write_scenario(
        tmp_path,
        '[[fault]]\neffect = "error_response"\ntraceback = false\n'
        'error = "ValueError: tool parser kimi_k3 failed to parse the model output"\nwhen = { tools = true }\n',
    )
    process = sim(["org/model", "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3"], scenario)
    await process.ready(http)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    status, body = await chat(http, process.url, messages=_long_prompt(1, "go"), max_tokens=4, tools=tools)
    assert (status, body["error"]["type"]) == (500, "InternalServerError")
    assert body["error"]["message"] == "ValueError: tool parser kimi_k3 failed to parse the model output"
    status, _ = await chat(http, process.url, messages=_long_prompt(1, "go"), max_tokens=4)
    assert status == 200
    async with http.get(f"{process.url}/health") as response:
        assert response.status == 200
    out = process.stop()
    assert out.code == 0
    logged = [line for line in out.stdout.split("\n") if "tool parser kimi_k3 failed" in line]
    assert len(logged) == 1 and " ERROR " in logged[0] and "Traceback" not in out.stdout


async def test_concurrency_condition_counts_the_requests_in_the_engine(
    sim: StartSim, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    scenario = write_scenario(  # a quick start-up, then 8 tokens take 4 simulated s (0.2 s): all 4 overlap
        tmp_path,
        "[timings]\ngpu_detect = 1.0\nweight_load = 1.0\nengine_init = 1.0\ndecode_tokens_per_s = 2.0\n"
        '[[fault]]\neffect = "error_response"\nerror = "RuntimeError: busy"\nwhen = { concurrency_min = 3 }\n',
    )
    process = sim(["org/model"], scenario, speed="20")
    await process.ready(http)
    status, _ = await chat(http, process.url, messages=_long_prompt(1, "alone"), max_tokens=8)
    assert status == 200
    results = await asyncio.gather(
        *(chat(http, process.url, messages=_long_prompt(1, f"n{n}"), max_tokens=8) for n in range(4))
    )
    assert sorted(status for status, _ in results) == [200, 200, 500, 500]  # the 3rd and 4th in flight


def test_a_startup_hang_stops_making_progress_until_sigterm(sim: StartSim, tmp_path: Path) -> None:
    scenario = write_scenario(
        tmp_path,
        '[[fault]]\nphase = "gpu_detect"\neffect = "hang"\nrank = 1\n'
        'error = "host:1:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM"\n',
    )
    process = sim(["org/model", "-tp", "2"], scenario)
    assert _wait_for(process, "Resolved architecture")
    time.sleep(1.0)  # 200 simulated seconds: far longer than the rest of the start-up
    assert process.process.poll() is None
    out = process.stop()
    assert out.code == 0
    assert "Starting to load model" not in out.stdout
    last = [line for line in out.stderr.split("\n") if line and "shutdown" not in line.lower()]
    assert "(Worker_TP1 pid=" in last[-1] and last[-1].endswith("NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM")


def test_a_flaky_startup_fault_strikes_by_launch_number(tmp_path: Path) -> None:
    scenario = write_scenario(  # a launch the flaky fault spares meets the certain one later
        tmp_path,
        '[host]\nseed = 3\n[[fault]]\nid = "ecc"\nphase = "weight_load"\nerror = "RuntimeError: ECC"\nprobability = 0.5\n'
        '[[fault]]\nphase = "engine_init"\nerror = "RuntimeError: later"\n',
    )
    fault = load_scenario(scenario, catalog().phases()).faults[0]
    expected = [fault.strikes(3, launch) for launch in (1, 2, 3, 4, 5, 6)]
    assert True in expected and False in expected
    seen = []
    for launch in (1, 2, 3, 4, 5, 6):
        done = subprocess.run(
            [sys.executable, "-m", "vllm_sim", "serve", "m", "--port", str(free_port())],
            capture_output=True,
            timeout=15,
            env={"VLLM_SIM_SCENARIO": scenario, "VLLM_SIM_SPEED": "2000", "VLLM_SIM_LAUNCH": str(launch)},
        )
        assert done.returncode == 1
        seen.append(b"RuntimeError: ECC" in done.stdout + done.stderr)
    assert seen == expected


# --- HTTP -------------------------------------------------------------------------------------------


async def test_openai_endpoints_usage_and_errors(sim: StartSim, http: aiohttp.ClientSession) -> None:
    process = sim(["org/model", "--served-model-name", "served", "--max-model-len", "256"])
    await process.ready(http)
    url = process.url

    async with http.get(f"{url}/health") as response:
        assert response.status == 200 and await response.read() == b""
        assert response.headers["server"] == "uvicorn"
    async with http.get(f"{url}/version") as response:
        assert await response.json() == {"version": "0.32.0"}
    async with http.get(f"{url}/v1/models") as response:
        card = (await response.json())["data"][0]
    assert (card["id"], card["root"], card["owned_by"], card["max_model_len"]) == ("served", "org/model", "vllm", 256)

    messages = [{"role": "user", "content": "Summarise the incident in one sentence."}]
    status, cut = await chat(http, url, model="served", messages=messages, max_tokens=5)
    assert status == 200
    usage = cut["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert cut["choices"][0]["finish_reason"] == "length"
    status, full = await chat(http, url, model="served", messages=messages, max_tokens=100)
    assert full["choices"][0]["finish_reason"] == "stop"
    assert full["usage"]["completion_tokens"] == 48
    status, again = await chat(http, url, model="served", messages=messages, max_tokens=100)
    assert again["choices"][0]["message"] == full["choices"][0]["message"]

    async with http.post(f"{url}/v1/completions", json={"model": "served", "prompt": "Once upon a time"}) as response:
        completion = await response.json()
    assert completion["object"] == "text_completion" and completion["choices"][0]["finish_reason"] == "length"
    assert completion["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 20,
        "completion_tokens": 16,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }

    body = {
        "model": "served",
        "messages": messages,
        "max_tokens": 100,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        events = [line[6:] for line in (await response.text()).split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert streamed == full["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == {k: full["usage"][k] for k in ("prompt_tokens", "total_tokens", "completion_tokens")}

    status, refused = await chat(http, url, model="other", messages=messages)
    assert status == 404
    assert refused == {
        "error": {
            "message": "The model `other` does not exist. Valid aliases: served.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    status, refused = await chat(http, url, model="served", messages=[{"role": "user", "content": "word " * 300}])
    assert status == 400
    assert refused["error"]["message"] == (
        "This model's maximum context length is 256 tokens. However, your prompt contains at least 257 input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
        "prompt. (parameter=input_tokens, value=257)"
    )
    assert (refused["error"]["param"], refused["error"]["code"]) == ("input_tokens", 400)
    status, refused = await chat(http, url, model="served", messages=messages, max_tokens=300)
    assert status == 400 and refused["error"]["message"] == (
        "max_tokens=300 cannot be greater than max_model_len=256. Please request fewer output tokens. "
        "(parameter=max_tokens, value=300)"
    )
    status, cut = await chat(http, url, model="served", messages=messages, max_tokens=250)  # vLLM 0.32 cuts it
    assert status == 200 and cut["usage"]["total_tokens"] <= 256
    async with http.get(f"{url}/nowhere") as response:
        assert response.status == 404 and await response.json() == {"detail": "Not Found"}

    async with http.get(f"{url}/metrics") as response:
        metrics = await response.text()
    # prometheus_client writes labels sorted by name, as real vLLM's /metrics has them
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="served"} 2.0' in metrics
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="served"} 4.0' in metrics
    assert 'vllm:num_requests_running{engine="0",model_name="served"} 0.0' in metrics
    assert "# TYPE vllm:prefix_cache_queries_total counter" in metrics
    assert re.search(
        r'vllm:cache_config_info\{block_size="16",.*enable_prefix_caching="True",.*num_gpu_blocks="\d+"', metrics
    )
    assert await metric(http, url, "vllm:generation_tokens_total") == 5 + 48 + 48 + 16 + 48 + 48

    out = process.stop()
    assert "(APIServer pid=" in out.stdout
    assert re.search(r'INFO:     127\.0\.0\.1:\d+ - "POST /v1/chat/completions HTTP/1\.1" 200 OK', out.stdout)
    assert '"POST /v1/chat/completions HTTP/1.1" 404 Not Found' in out.stdout


async def test_http_on_the_wire_is_uvicorns(sim: StartSim, http: aiohttp.ClientSession) -> None:
    """Status lines with reasons, keep-alive with pipelined requests, HEAD refused without a body, a malformed
    request answered 400 and the connection closed, and the server serving on after all of it."""
    process = sim(["org/model"])
    await process.ready(http)

    def exchange(data: bytes, wait: float = 0.3) -> bytes:
        with socket.create_connection(("127.0.0.1", process.port), timeout=5) as conn:
            conn.sendall(data)
            time.sleep(wait)
            conn.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        return answer

    pipelined = await asyncio.to_thread(
        exchange, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert pipelined.count(b"HTTP/1.1 200 OK\r\n") == 2 and pipelined.endswith(b'{"version":"0.32.0"}')
    assert b"\r\nserver: uvicorn\r\n" in pipelined and b"\r\ndate: " in pipelined
    head = await asyncio.to_thread(exchange, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and head.endswith(b"\r\n\r\n")
    malformed = await asyncio.to_thread(exchange, b"NOT HTTP AT ALL\r\n\r\n")
    assert malformed.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"connection: close" in malformed
    cut = await asyncio.to_thread(exchange, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{", 0.05)
    assert cut == b""  # the client went mid-body: nothing to answer
    async with http.post(f"{process.url}/tokenize", json={"prompt": "still serving"}) as response:
        assert response.status == 200 and (await response.json())["count"] > 0
    out = process.stop()
    assert out.code == 0 and "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize("caching", [True, False])
async def test_prefix_cache_counters_follow_vllm(sim: StartSim, http: aiohttp.ClientSession, caching: bool) -> None:
    args = ["org/model", "--enforce-eager"] + ([] if caching else ["--no-enable-prefix-caching"])
    process = sim(args)
    await process.ready(http)
    messages = [{"role": "user", "content": " ".join(f"fact{i}" for i in range(150))}]
    seen = []
    for _ in range(2):
        queries = await metric(http, process.url, "vllm:prefix_cache_queries_total")
        hits = await metric(http, process.url, "vllm:prefix_cache_hits_total")
        status, body = await chat(http, process.url, messages=messages, max_tokens=8)
        assert status == 200
        prompt_tokens = body["usage"]["prompt_tokens"]
        queried = await metric(http, process.url, "vllm:prefix_cache_queries_total") - queries
        hit = await metric(http, process.url, "vllm:prefix_cache_hits_total") - hits
        seen.append((prompt_tokens, queried, hit))
    async with http.get(f"{process.url}/metrics") as response:
        assert f'enable_prefix_caching="{caching}"' in await response.text()
    out = process.stop()
    assert out.code == 0
    assert "torch.compile" not in out.stdout and "Capturing CUDA graphs" not in out.stderr  # --enforce-eager
    (tokens, first_queries, first_hits), (_, second_queries, second_hits) = seen
    if caching:
        assert (first_queries, first_hits) == (tokens, 0)
        assert (second_queries, second_hits) == (tokens, (tokens - 1) // 16 * 16)  # whole blocks, never the last token
    else:
        assert (first_queries, first_hits, second_queries, second_hits) == (0, 0, 0, 0)


# --- units --------------------------------------------------------------------------------------------


def test_prefix_cache_counts_whole_blocks_and_recomputes_the_last_token() -> None:
    cache = PrefixCache(enabled=True, block_size=4, capacity_blocks=2)
    prompt = [str(i) for i in range(8)]
    assert cache.schedule(prompt) == 0
    cache.store(prompt)
    assert cache.schedule(prompt) == 4  # 8 tokens: 2 full blocks, but at most 7 tokens may hit
    assert cache.schedule([*prompt, "x"]) == 8
    assert cache.schedule(["y", *prompt]) == 0  # a block only hits with its whole prefix
    assert (cache.queries, cache.hits) == (8 + 8 + 9 + 9, 12)
    cache.store([str(i) for i in range(100, 108)])  # capacity 2 blocks: the old ones are evicted
    assert cache.schedule([*prompt, "x"]) == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("32k", (32000, False)),
        ("32K", (32768, False)),
        ("-1", (None, True)),
        ("auto", (None, True)),
        ("4096", (4096, False)),
    ],
)
def test_max_model_len_reads_like_vllm(value: str, expected: tuple[int | None, bool]) -> None:
    settings = settings_from(parse_serve_args(["m", "--max-model-len", value]), ["auto"])
    assert (settings.max_model_len, settings.auto_fit) == expected


def test_flag_values_are_checked() -> None:
    with pytest.raises(UsageError, match="invalid float value: 'most'"):
        settings_from(parse_serve_args(["m", "--gpu-memory-utilization", "most"]), ["auto"])


def test_fault_conditions_on_flags_and_prompt_length() -> None:
    with_flag = parse_serve_args(["m", "--enable-prefix-caching", "--max-model-len", "262144", "-tp", "8"])
    without = parse_serve_args(["m"])
    negated = parse_serve_args(["m", "--no-enable-prefix-caching"])
    host = load_scenario(None, catalog().phases()).host
    present = When(flags_present=("--enable-prefix-caching",))
    assert present.launch_matches(with_flag, host) and not present.launch_matches(without, host)
    assert not present.launch_matches(negated, host)
    assert When(flags_present=("--no-enable-prefix-caching",)).launch_matches(negated, host)
    assert When(flags_absent=("--enforce-eager",)).launch_matches(with_flag, host)
    assert not When(flags_absent=("--max-model-len",)).launch_matches(with_flag, host)
    values = When(flag_values=(("--max-model-len", ">131072"), ("--tensor-parallel-size", "8")))
    assert values.launch_matches(with_flag, host) and not values.launch_matches(without, host)  # not given: no value
    assert not When(flag_values=(("--max-model-len", "<=131072"),)).launch_matches(with_flag, host)
    assert When(flag_values=(("--max-model-len", "!=4096"),)).launch_matches(with_flag, host)
    assert When(driver_below="580.65.07").launch_matches(without, host)  # the default host runs 580.65.06
    assert not When(driver_below="580").launch_matches(without, host)
    assert When(foreign_memory=False).launch_matches(without, host)
    assert not When(foreign_memory=True).launch_matches(without, host)
    request = RequestView(prompt_tokens=10, repeated_prefix=True, tools=False, concurrency=3)
    assert When(prompt_tokens_min=10, repeated_prefix=True, tools=False, concurrency_min=3).request_matches(request)
    assert not When(prompt_tokens_min=11).request_matches(request)
    assert not When(tools=True).request_matches(request)
    assert not When(concurrency_min=4).request_matches(request)
    assert not When(repeated_prefix=False).request_matches(request)


def test_a_flaky_fault_varies_with_the_launch_and_replays_with_the_seed() -> None:
    fault = Fault(id="ecc", phase="weight_load", effect="crash", error="", probability=0.3)
    draws = [fault.strikes(seed=7, launch=n) for n in range(1, 1001)]
    assert 250 < sum(draws) < 350  # about the probability over many launches
    assert draws == [fault.strikes(seed=7, launch=n) for n in range(1, 1001)]  # the same run replays
    assert draws != [fault.strikes(seed=8, launch=n) for n in range(1, 1001)]  # another seed, other attempts
    assert all(Fault(id="x", phase="request", effect="crash", error="").strikes(0, n) for n in range(50))


@pytest.mark.parametrize("multiproc", [True, False])
def test_catalog_renders_every_error_and_stops_at_a_real_line(multiproc: bool) -> None:
    ids = {line.id for line in script()}
    command = parse_serve_args(["m", "-tp", "2" if multiproc else "1"])
    settings = settings_from(command, ["auto"])
    values = compute_facts(settings, load_scenario(None, catalog().phases())).values()
    for key, spec in catalog().errors.items():
        assert spec.phase == "request" or spec.at in ids, key
        blocks = catalog().blocks(spec, 1, multiproc, values)
        root = blocks[0]
        assert root.frames[0].startswith("  File "), key
        assert re.match(r"[\w.]+(Error|Exception): \S", root.exception[0]), key  # `Type: message`, formatted
        assert all(block.frames and block.exception for block in blocks), key
