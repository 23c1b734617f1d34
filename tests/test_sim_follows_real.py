"""vllm-sim follows the real server: one deployment served by real vLLM (the CPU build) and by vllm-sim, the
same requests sent to both, and what the method sees compared: phases in order, answers' shape, metric names,
4xx texts, /tokenize, the shutdown lines and exit code. A difference fails here; the simulator is what changes.

One real server start serves the whole module (~1 minute on two cores); the sim runs at 1000x speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from kernel.analyzer.whole_log import analyze_text
from runner.ports import free_port
from tests.vllm_cpu import ENV, REPO, serve_argv

pytestmark = pytest.mark.timeout(420)

HOST = "127.0.0.1"
# The deployment both serve (issue 11's healthy case, with a short context so that limits are cheap to hit).
FLAGS = ["--served-model-name", "m", "--dtype", "bfloat16", "--max-model-len", "2048", "--enable-prefix-caching"]
FLAGS += ["--max-num-seqs", "4"]
START_TIMEOUT_S = 240.0
MESSAGES = [{"role": "user", "content": "Summarise the incident in one sentence."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
# The same long prompt twice: the second one's blocks come from the prefix cache (the method's cache_hit).
CACHED = [{"role": "user", "content": " ".join(f"fact{i} holds" for i in range(120))}]
# (method, path, body): the requests whose answers must agree.
REQUESTS: dict[str, tuple[str, str, Any]] = {
    "models": ("GET", "/v1/models", None),
    "chat": ("POST", "/v1/chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": 4}),
    "completion": ("POST", "/v1/completions", {"model": "m", "prompt": "Once upon a time", "max_tokens": 4}),
    "stream": (
        "POST",
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": MESSAGES,
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    "tokenize_prompt": ("POST", "/tokenize", {"model": "m", "prompt": "Once upon a time"}),
    "tokenize_messages": ("POST", "/tokenize", {"model": "m", "messages": MESSAGES}),
    "tokenize_too_long": ("POST", "/tokenize", {"model": "m", "prompt": "word " * 3000}),
    "cached_first": ("POST", "/v1/chat/completions", {"model": "m", "messages": CACHED, "max_tokens": 2}),
    "cached_again": ("POST", "/v1/chat/completions", {"model": "m", "messages": CACHED, "max_tokens": 2}),
    # bad requests: each refusal must read the same
    "too_long_chat": (
        "POST",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "word " * 3000}]},
    ),
    "too_long_completion": ("POST", "/v1/completions", {"model": "m", "prompt": "word " * 3000}),
    "too_long_ids": ("POST", "/v1/completions", {"model": "m", "prompt": list(range(10, 2060))}),
    "max_tokens_too_large": ("POST", "/v1/chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": 5000}),
    "max_completion_tokens_too_large": (
        "POST",
        "/v1/chat/completions",
        {"model": "m", "messages": MESSAGES, "max_completion_tokens": 5000},
    ),
    "max_tokens_zero": ("POST", "/v1/chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": 0}),
    "no_room_left": ("POST", "/v1/completions", {"model": "m", "prompt": list(range(10, 2058)), "max_tokens": 1}),
    "unknown_model": ("POST", "/v1/chat/completions", {"model": "other", "messages": MESSAGES}),
    "unknown_model_completion": ("POST", "/v1/completions", {"model": "other", "prompt": "hi"}),
    "unknown_model_tokenize": ("POST", "/tokenize", {"model": "other", "prompt": "hi"}),
    "tools_auto": (
        "POST",
        "/v1/chat/completions",
        {"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 2},
    ),
    "tools_default_choice": ("POST", "/v1/chat/completions", {"model": "m", "messages": MESSAGES, "tools": TOOLS}),
    "tools_required": (
        "POST",
        "/v1/chat/completions",
        {"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"},
    ),
    "no_messages": ("POST", "/v1/chat/completions", {"model": "m"}),
    "empty_messages": ("POST", "/v1/chat/completions", {"model": "m", "messages": []}),
    "no_prompt": ("POST", "/v1/completions", {"model": "m"}),
    "tokenize_nothing": ("POST", "/tokenize", {"model": "m"}),
    "not_json": ("POST", "/v1/chat/completions", b"{not json"),
    "nowhere": ("GET", "/nowhere", None),
}
# The metrics the method reads (kernel/data/ladder.toml's cache-hit evidence).
METHOD_METRICS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
# [shutdown] lines only vLLM CPU writes: its EngineCore runs its worker as a process of its own even at
# tensor-parallel-size 1 (the GPU build runs it inside EngineCore); which of them show varies with the race.
CPU_ONLY_SHUTDOWN = ("force killing sub process VLLM::Worker", "Executor: waiting for worker exit")


@dataclass
class Served:
    """One server's side of the comparison."""

    answers: dict[str, tuple[int, str]] = field(default_factory=dict)
    metrics_before: str = ""
    metrics: str = ""
    stdout: str = ""
    stderr: str = ""
    log: str = ""  # both streams merged line by line as they arrive, as the runner reads a launch
    code: int | None = None

    def json(self, name: str) -> Any:
        return json.loads(self.answers[name][1])


def _call(url: str, method: str, path: str, body: Any) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as refused:
        return int(refused.code), refused.read().decode()


def _serve(argv: list[str], env: dict[str, str], tmp: Path, name: str, port: int) -> Served:
    """Starts a server in its own process group, sends REQUESTS, stops it with SIGTERM to the group (as the
    runner's process backend does) and returns what it answered and wrote. The group is killed whatever happens.

    Each stream is read by a thread of its own and the lines merged in the order they arrive (the runner's
    way): a stop's echo can only be told from a failure when the stop notice and the readiness line, which
    vLLM writes to different streams, keep their order."""
    url = f"http://{HOST}:{port}"
    served = Served()
    streams: dict[str, list[str]] = {"stdout": [], "stderr": []}
    merged: list[str] = []
    lock = threading.Lock()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp, start_new_session=True
    )

    def read(pipe: IO[bytes], lines: list[str]) -> None:
        for raw in pipe:
            line = raw.decode(errors="replace")
            with lock:
                lines.append(line)
                merged.append(line)

    readers = [
        threading.Thread(target=read, args=(pipe, streams[key]), daemon=True)
        for key, pipe in (("stdout", process.stdout), ("stderr", process.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if time.monotonic() > deadline or process.poll() is not None:
                with lock:
                    raise AssertionError(f"{name} never became healthy:\n{''.join(streams['stderr'])[-3000:]}")
            time.sleep(0.5)
        served.metrics_before = _call(url, "GET", "/metrics", None)[1]
        for key, (method, path, body) in REQUESTS.items():
            served.answers[key] = _call(url, method, path, body)
        served.metrics = _call(url, "GET", "/metrics", None)[1]
        time.sleep(0.5)  # let the access log of the last request arrive before the stop
        os.killpg(process.pid, signal.SIGTERM)
        served.code = process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        with contextlib.suppress(ProcessLookupError):  # no child of the group (EngineCore, its worker) outlives us
            os.killpg(process.pid, signal.SIGKILL)
        for reader in readers:
            reader.join(30)
    (tmp / f"{name}.log").write_text("".join(merged))  # kept for a reader of a failure
    served.stdout, served.stderr = ("".join(streams[key]) for key in ("stdout", "stderr"))
    served.log = "".join(merged)
    return served


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return int(response.status) == 200
    except OSError:  # refused (not listening yet), or an HTTP error
        return False


@pytest.fixture(scope="module")
def both(
    tmp_path_factory: pytest.TempPathFactory, vllm_models: dict[str, Path], vllm_caches: dict[str, str]
) -> Iterator[dict[str, Served]]:
    """The deployment on real vLLM CPU and on vllm-sim: one start each for the whole module."""
    tmp = tmp_path_factory.mktemp("sim-vs-real")
    model = vllm_models["llama-4k"]
    port = free_port(HOST)
    real = _serve(
        serve_argv(model, *FLAGS, "--host", HOST, "--port", str(port)),
        {**os.environ, **ENV, **vllm_caches},
        tmp,
        "real",
        port,
    )
    port = free_port(HOST)
    sim_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "VLLM_SIM_SPEED": "1000", "PYTHONPATH": str(REPO)}
    sim_argv = [sys.executable, "-m", "vllm_sim", "serve", str(model), *FLAGS, "--host", HOST, "--port", str(port)]
    sim = _serve(sim_argv, sim_env, tmp, "sim", port)
    yield {"real": real, "sim": sim}


# --- normalising: what may differ legitimately -----------------------------------------------------------------

_PREFIX = re.compile(r"^\((\w[\w-]*) pid=\d+\) ")
_HEADER = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d ")


def _line(line: str) -> str:
    """A log line without what differs from launch to launch: pids, the time, the port."""
    line = _PREFIX.sub(lambda m: f"({m.group(1)}) ", line)
    head, _, rest = line.partition(") ")
    if rest and head.startswith("("):
        line = f"{head}) {_HEADER.sub(lambda m: m.group(1) + ' ', rest)}"
    return re.sub(r"pid \d+", "pid N", line).rstrip("\r")


def _shape(value: Any) -> Any:
    """A JSON value's structure: keys and the types of leaves (ids, texts and counts differ)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value[:1]]
    return type(value).__name__


def _events(text: str) -> list[Any]:
    events = [chunk.removeprefix("data: ") for chunk in text.split("\n\n") if chunk.startswith("data: ")]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


def _metric_types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


# --- the comparisons --------------------------------------------------------------------------------------------


def test_the_method_reads_the_same_phases_in_the_same_order(both: dict[str, Served]) -> None:
    real, sim = (analyze_text(both[side].log) for side in ("real", "sim"))
    assert sim.phases_seen == real.phases_seen == ("gpu_detect", "weight_load", "engine_init", "api_listen", "request")
    assert sim.healthy == real.healthy
    assert (sim.first_error is None) == (real.first_error is None)
    if real.first_error is not None and sim.first_error is not None:  # the unknown-model line both log
        assert _line(sim.first_error.line) == _line(real.first_error.line)
        assert (sim.first_error.phase, sim.first_error.category) == (real.first_error.phase, real.first_error.category)
    # the start-up lines the analyzer's phase markers and a reader rely on, in vLLM 0.32's order
    markers = [
        "version 0.32.0",
        "non-default args: {",
        "Resolved architecture: LlamaForCausalLM",
        "Using max model len 2048",
        "Initializing a V1 LLM engine (v0.32.0)",
        "Starting to load model",
        "Loading weights took",
        "KV cache size:",
        "init engine (profile, create kv cache, warmup model) took",
        "Supported tasks: ['generate']",
        "Scale-out endpoints are disabled.",
        "Detected the chat template content format to be 'string'.",
        "Starting vLLM server on http://",
        "Available routes are:",
        "INFO:     Started server process [",
        "INFO:     Waiting for application startup.",
        "INFO:     Application startup complete.",
    ]
    for side in ("real", "sim"):
        lines = both[side].log.split("\n")
        at = [next((i for i, line in enumerate(lines) if marker in line), -1) for marker in markers]
        missing = [marker for marker, i in zip(markers, at, strict=True) if i < 0]
        assert not missing, (side, missing)
        order = [both[side].log.index(marker) for marker in markers]
        assert order == sorted(order) or _ordered_by_stream(both[side], markers), (side, order)
    # the routes in order; a route's methods are a set that vLLM prints in hash order ('HEAD, GET' or 'GET, HEAD')
    routes = [
        [
            (path, set(methods.split(", ")))
            for path, methods in re.findall(r"Route: (\S+), Methods: (.+)", served.stdout)
        ]
        for served in (both["real"], both["sim"])
    ]
    assert routes[1] == routes[0]


def _ordered_by_stream(served: Served, markers: list[str]) -> bool:
    """Each stream in order on its own (uvicorn's lines and vLLM's go to different streams)."""
    for text in (served.stdout, served.stderr):
        found = [text.index(marker) for marker in markers if marker in text]
        if found != sorted(found):
            return False
    return True


def test_lines_go_to_the_same_stream(both: dict[str, Served]) -> None:
    """The runner may read stdout and stderr apart: each kind of line is where vLLM writes it."""
    probes = ["Application startup complete.", "Starting vLLM server on", '"POST /v1/chat/completions HTTP/1.1" 200 OK']
    probes += ["[shutdown] API server: shutdown triggered", "Application shutdown complete."]
    for probe in probes:
        where = [
            ("stdout" if probe in s.stdout else "") + ("stderr" if probe in s.stderr else "") for s in both.values()
        ]
        assert where[0] == where[1], (probe, where)
    # uvicorn's lines carry no process prefix in 0.32; vLLM's own lines do
    for served in both.values():
        assert re.search(r"^INFO:     Application startup complete\.$", served.log, re.M)
        assert re.search(r'^INFO:     127\.0\.0\.1:\d+ - "GET /v1/models HTTP/1\.1" 200 OK$', served.log, re.M)


def test_answers_have_the_same_shape(both: dict[str, Served]) -> None:
    real, sim = both["real"], both["sim"]
    for name in ("models", "chat", "completion", "tokenize_prompt", "tokenize_messages", "cached_again"):
        assert sim.answers[name][0] == real.answers[name][0] == 200, name
        assert _shape(sim.json(name)) == _shape(real.json(name)), name
    for side in (real, sim):
        assert side.json("models")["data"][0]["max_model_len"] == 2048
        chat = side.json("chat")
        assert chat["choices"][0]["finish_reason"] == "length" and chat["usage"]["completion_tokens"] == 4
        usage = chat["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert side.json("completion")["choices"][0]["finish_reason"] == "length"
    stream = [_events(side.answers["stream"][1]) for side in (real, sim)]
    assert [_shape(event) for event in stream[1]] == [_shape(event) for event in stream[0]]
    for events in stream:
        assert events[-1] == "[DONE]" and events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 3
        finishes = [event["choices"][0]["finish_reason"] for event in events[:-2]]
        assert finishes == [None, None, None, "length"]  # role chunk, then 3 tokens; the last carries the finish


def test_tokenize_counts_and_never_refuses_a_long_prompt(both: dict[str, Served]) -> None:
    for side in both.values():
        for name in ("tokenize_prompt", "tokenize_messages", "tokenize_too_long"):
            status, _ = side.answers[name]
            answer = side.json(name)
            assert status == 200 and set(answer) == {"count", "max_model_len", "tokens", "token_strs"}, name
            assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == 2048
        assert side.json("tokenize_too_long")["count"] > 2048
        chat_prompt = side.json("cached_first")["usage"]["prompt_tokens"]
        assert chat_prompt > side.json("tokenize_prompt")["count"]
        # /tokenize counts a chat as the completion will see it (template and generation prompt included)
        assert side.json("tokenize_messages")["count"] == side.json("chat")["usage"]["prompt_tokens"]


def test_bad_requests_are_refused_with_the_same_texts(both: dict[str, Served]) -> None:
    real, sim = both["real"], both["sim"]
    first = list(REQUESTS).index("too_long_chat")
    for name in list(REQUESTS)[first:]:
        assert sim.answers[name][0] == real.answers[name][0], name
        assert sim.json(name) == real.json(name), name
    # what the API server logs for them (the unknown model on chat; the empty conversation)
    for needle in ("Error with model error=ErrorInfo(", "Chat template rejected the request:"):
        logged = [sorted(_line(line) for line in side.stdout.split("\n") if needle in line) for side in (real, sim)]
        assert logged[0] and logged[1] == logged[0], needle


def test_metrics_the_method_reads(both: dict[str, Served]) -> None:
    ladder = (REPO / "kernel" / "data" / "ladder.toml").read_text()
    assert all(name in ladder for name in METHOD_METRICS)  # the names the method reads are still these
    real, sim = (_metric_types(both[side].metrics) for side in ("real", "sim"))
    assert {name: sim.get(name) for name in METHOD_METRICS} == {name: real.get(name) for name in METHOD_METRICS}
    assert {name: real[name] for name in sim if name in real} == sim  # every sim metric exists, same type
    for side in both.values():
        hits = _metric(side.metrics, "vllm:prefix_cache_hits_total") - _metric(
            side.metrics_before, "vllm:prefix_cache_hits_total"
        )
        assert hits > 0  # the repeated prompt was served from the prefix cache


def test_sigterm_stops_both_the_same_way(both: dict[str, Served]) -> None:
    real, sim = both["real"], both["sim"]
    assert real.code == sim.code == 0
    marked = [[_line(line) for line in side.stdout.split("\n") if "[shutdown]" in line] for side in (real, sim)]
    expected = {line for line in marked[0] if not any(cpu in line for cpu in CPU_ONLY_SHUTDOWN)}
    assert set(marked[1]) == expected
    for process in ("(APIServer)", "(EngineCore)"):  # each process's lines in the order it writes them
        mine = [line for line in dict.fromkeys(marked[1]) if line.startswith(process)]
        theirs = [line for line in dict.fromkeys(marked[0]) if line in mine]
        assert mine == theirs, process
    tail = [
        "INFO:     Shutting down",
        "INFO:     Waiting for application shutdown.",
        "INFO:     Application shutdown complete.",
    ]
    for side in (real, sim):
        lines = [line for line in side.log.split("\n") if line in tail]
        assert lines == tail
        assert "Finished server process" not in side.log
