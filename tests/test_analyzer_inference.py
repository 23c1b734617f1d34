"""Issue 15: what the analyzer infers on logs unlike the corpus. Phase from frames, chained tracebacks and
logger modules when an excerpt has no markers; wrappers demoted by what they are and classified by the
cause they quote; the categories of lines that used to fall to `other`; a deliberate stop after serving
is not a failure, a crash is. Every log here is written by hand; each is also checked scanned == streamed.
"""

from __future__ import annotations

import io

import pytest

from kernel.analyzer import Analysis, ErrorFinding, analyze_lines, analyze_stream
from kernel.analyzer import scan as scan_module
from kernel.analyzer.rules import default_rules
from tests.test_analyzer_support import traceback

RULES = default_rules()
W = "(Worker_TP1 pid=4411) ERROR 11-05 03:12:44 [multiproc_executor.py:702] "
CORE = "(EngineCore_DP0 pid=4300) ERROR 11-05 03:12:45 [core.py:861] "
API = "(APIServer pid=4200) "
READY = [
    f"{API}INFO 11-05 03:10:00 [api_server.py:1100] vLLM API server version 0.12.0",
    "(EngineCore_DP0 pid=4300) INFO 11-05 03:10:30 [gpu_model_runner.py:2000] Model loading took 14.9 GiB and 20.1 seconds",
    f"{API}INFO:     Application startup complete.",
    f'{API}INFO:     10.0.0.9:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]


def analyzed(lines: list[str]) -> Analysis:
    """The streamed result, after checking that whole-file analysis gives the same."""
    data = ("\n".join(lines) + "\n").encode()
    result = analyze_lines(lines)
    if scan_module.usable(io.BytesIO(data), RULES):
        assert analyze_stream(io.BytesIO(data)) == result
    return result


def first(lines: list[str]) -> ErrorFinding:
    error = analyzed(lines).first_error
    assert error is not None
    return error


# --- phase without markers ------------------------------------------------------------------------

FRAMES = {
    "request": ["run_busy_loop", "step", "execute_model"],
    "request:serving": ["create_chat_completion", "chat_completion_stream_generator"],
    "weight_load": ["load_model", "load_weights", "weight_loader"],
    "weight_load:hub": ["get_model", "hf_hub_download"],
    "engine_init": ["run_engine_core", "_initialize_kv_caches", "determine_available_memory", "profile_run"],
    "gpu_detect": ["run_engine_core", "init_device", "set_device", "_lazy_init"],
}


@pytest.mark.parametrize("case", FRAMES, ids=FRAMES.keys())
def test_frames_place_an_excerpt_without_markers(case: str) -> None:
    error = first(traceback(W, FRAMES[case], "RuntimeError: something went wrong in here"))
    assert error.phase == case.partition(":")[0]
    assert any(reason.startswith(f"phase: {error.phase} (from frames): traceback frame") for reason in error.why)


def test_argument_validation_frames_are_gpu_detect() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.12/site-packages/vllm/config/scheduler.py", line 88, in __post_init__',
        "    self._verify_args()",
        "ValueError: max_num_seqs must be positive",
    ]
    assert first(lines).phase == "gpu_detect"


def test_the_outermost_frame_wins_over_inner_library_frames() -> None:
    frames = ["run_engine_core", "_initialize_kv_caches", "profile_run", "load_weights"]  # e.g. a LoRA warm-up
    assert first(traceback(W, frames, "RuntimeError: boom")).phase == "engine_init"


def test_a_bare_exception_is_placed_by_the_traceback_chained_to_it() -> None:
    lines = [
        f'{CORE}  File "/opt/venv/lib/python3.12/site-packages/vllm/distributed/shm_queue.py", line 77, in dequeue',
        f"{CORE}    raise TimeoutError",
        f"{CORE}TimeoutError",
        f"{CORE}",
        f"{CORE}The above exception was the direct cause of the following exception:",
        f"{CORE}",
        *traceback(CORE, ["run_engine_core", "run_busy_loop", "step"], "RuntimeError: the worker did not answer"),
    ]
    error = first(lines)
    assert (error.line, error.phase, error.category) == (lines[2], "request", "request_error")
    assert any("(chained traceback)" in reason for reason in error.why)


def test_an_unplaced_exception_does_not_wait_past_its_stream() -> None:
    lines = [f"{CORE}KeyError: 'rope_scaling'", "(EngineCore_DP0 pid=4300) INFO 11-05 03:12:46 [core.py:1] next"]
    error = first(lines)
    # Nothing places it (no marker, frame, module or wrapper after it): unknown, not a guessed phase.
    assert (error.line, error.phase, error.phase_from) == (lines[0], "unknown", "unknown")


def test_the_logger_module_places_an_error_without_frames() -> None:
    error = first(["ERROR 02-10 08:00:01 [serving_completion.py:140] ValueError: prompt must not be empty"])
    assert (error.phase, error.category) == ("request", "request_error")
    loading = first(["ERROR 02-10 08:00:01 [weight_utils.py:412] KeyError: 'model.layers.0.mlp.gate.weight'"])
    assert (loading.phase, loading.category) == ("weight_load", "weight_load")


def test_markers_lag_so_a_frame_still_places_an_error_before_readiness() -> None:
    # Rank 0 has finished loading (its marker moved the phase on); rank 1 is still loading and fails.
    lines = [READY[1], *traceback(W, ["load_model", "load_weights"], "RuntimeError: shard 3 is truncated")]
    assert first(lines).phase == "weight_load"


def test_once_serving_the_phase_is_request_whatever_the_frames() -> None:
    lines = [*READY, *traceback(W, ["add_lora", "load_weights"], "RuntimeError: adapter tensor shape mismatch")]
    error = first(lines)
    assert (error.phase, error.category) == ("request", "request_error")


def test_an_oom_while_loading_weights_is_oom_in_weight_load() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 0 has 44 MiB free."
    error = first(traceback(W, ["load_model", "load_weights"], oom))
    assert (error.phase, error.category, error.secondary_oom) == ("weight_load", "oom", False)


def test_vllms_oom_notice_before_the_reraise_is_a_wrapper_of_the_allocator_error() -> None:
    notice = (
        f"{CORE}Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization. "
        "(original error: CUDA out of memory. Tried to allocate 1.00 GiB)"
    )
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."
    lines = [notice, *traceback(CORE, ["run_engine_core", "load_model"], oom)]
    error = first(lines)
    assert (error.line, error.phase, error.category) == (lines[-1], "weight_load", "oom")
    alone = first([notice])
    assert (alone.line, alone.phase, alone.category) == (notice, "weight_load", "oom")


# --- wrappers -------------------------------------------------------------------------------------


def test_a_worker_failure_quoting_its_cause_is_classified_by_the_cause() -> None:
    lines = traceback(
        CORE,
        ["run_engine_core", "_initialize_kv_caches", "determine_available_memory", "collective_rpc"],
        "RuntimeError: Worker failed with error 'CUDA error: the provided PTX was compiled with an unsupported "
        "toolchain.', please check the stack trace above for the root cause",
    )
    error = first(lines)
    assert (error.line, error.phase, error.category) == (lines[-1], "engine_init", "ptx_toolchain")


def test_a_worker_failure_after_its_cause_is_passed_over() -> None:
    root = traceback(W, ["worker_busy_loop", "execute_model"], "RuntimeError: CUDA error: misaligned address")
    wrapper = traceback(
        CORE,
        ["run_busy_loop", "collective_rpc"],
        "RuntimeError: Worker failed with error 'CUDA error: misaligned address'",
    )
    result = analyzed([*root, *wrapper])
    assert result.first_error is not None and result.first_error.line == root[-1]
    assert any(reason.startswith("wrapper passed over") and "worker_proc_failed" in reason for reason in result.why)


def test_a_ray_task_error_names_its_cause_class() -> None:
    lines = [
        "ray.exceptions.RayTaskError(DistBackendError): ray::RayWorkerWrapper.execute_method() (pid=9911, ip=10.2.0.7)",
    ]
    error = first(lines)
    assert (error.line, error.category) == (lines[0], "nccl_comm")


def test_a_ray_wrapped_nccl_failure_is_the_workers_nccl_error() -> None:
    nccl = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited"
    lines = [
        "(RayWorkerWrapper pid=9911, ip=10.2.0.7) ERROR 11-05 03:12:44 [worker_base.py:600] Error executing method "
        "'init_device'. This might cause deadlock in distributed execution.",
        *traceback("(RayWorkerWrapper pid=9911, ip=10.2.0.7) ", ["execute_method", "init_device"], nccl),
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task. The actor is dead "
        "because its worker process has died. Worker exit type: SYSTEM_ERROR",
    ]
    error = first(lines)
    assert (error.line, error.phase, error.category) == (lines[-2], "gpu_detect", "nccl_comm")


def test_engine_core_failed_to_start_header_is_not_the_cause() -> None:
    root = "ValueError: Unknown quantization method: fp5"
    lines = [f"{CORE}EngineCore failed to start.", *traceback(CORE, ["run_engine_core", "__init__"], root)]
    error = first(lines)
    assert (error.line, error.category) == (lines[-1], "model_config")


def test_an_interrupt_before_readiness_is_the_hang_it_ended() -> None:
    lines = [
        f"{API}INFO 11-05 03:10:00 [api_server.py:1100] vLLM API server version 0.12.0",
        "(Worker_TP1 pid=4411) INFO 11-05 03:10:09 [gpu_model_runner.py:2100] Starting to load model big/model...",
        *traceback("", ["main", "run_server", "wait_for_engine_startup"], "KeyboardInterrupt"),
    ]
    error = first(lines)
    assert (error.phase, error.category, error.during) == ("weight_load", "weight_load", "hang")
    assert "interrupted" in error.hint


# --- categories that used to fall to `other` ------------------------------------------------------

CATEGORIES = {
    "no kernel image": (
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        "driver_cuda_init",
    ),
    "hub 401": (
        "huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized for url: "
        "https://huggingface.co/acme/private-7b/resolve/main/config.json",
        "weight_load",
    ),
    "hub 403": ("OSError: 403 Forbidden for url: https://huggingface.co/acme/gated/resolve/main/x.json", "weight_load"),
    "undefined symbol": (
        "ImportError: /usr/lib/python3/dist-packages/flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so: "
        "undefined symbol: _ZN2at4_ops5zeros4callEv",
        "model_config",
    ),
    "flag advice": (
        "ValueError: Chunked prefill is not supported with this attention backend; disable --enable-chunked-prefill.",
        "model_config",
    ),
    "container CDI": (
        "Error: crun: unresolvable CDI devices nvidia.com/gpu=0: OCI runtime attempted to invoke a command",
        "driver_cuda_init",
    ),
    "docker one line": (
        "docker: Error response from daemon: failed to create task for container: OCI runtime create failed: "
        "runc create failed: unable to start container process: error during container init: error running hook "
        "#0: exit status 1, stdout: , stderr: nvidia-container-cli: requirement error: unsatisfied condition: "
        "cuda>=12.9, please update your driver to a newer version",
        "driver_cuda_init",
    ),
}


@pytest.mark.parametrize("case", CATEGORIES, ids=CATEGORIES.keys())
def test_category_of_lines_that_used_to_be_other(case: str) -> None:
    line, category = CATEGORIES[case]
    assert first([line]).category == category


def test_an_rpc_time_out_while_serving_is_a_request_error() -> None:
    lines = [*READY, f"{CORE}TimeoutError: RPC call to sample_tokens timed out."]
    error = first(lines)
    assert (error.phase, error.category) == ("request", "request_error")


def test_a_capture_frame_makes_an_unnamed_cuda_error_a_cuda_graph_failure() -> None:
    error = first(
        traceback(
            W,
            ["determine_available_memory", "profile_cudagraph_memory", "_warmup_and_capture", "forward"],
            "RuntimeError: CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling `cublasLtMatmul(...)`",
        )
    )
    assert (error.phase, error.category, error.during) == ("engine_init", "cudagraph", "cudagraph_capture")


# --- a deliberate stop is not a failure, a crash is -----------------------------------------------

ECHO = traceback(
    f"{API}ERROR 11-05 04:00:01 [async_llm.py:480] ",
    ["output_handler", "get_output_async"],
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
    "root cause.",
)
HANDLER = f"{API}ERROR 11-05 04:00:01 [async_llm.py:480] AsyncLLM output_handler failed."
STOPS = {
    "shutdown marker": f"{API}INFO 11-05 04:00:00 [launcher.py:99] [shutdown] API server: shutdown triggered",
    "engine signal": "(EngineCore_DP0 pid=4300) INFO 11-05 04:00:00 [core.py:900] [shutdown] EngineCore: trigger "
    "received signal=SIGTERM",
    "uvicorn": f"{API}INFO:     Shutting down",
    "sigint": f"{API}INFO 11-05 04:00:00 [api_server.py:1500] Received SIGINT, stopping the server.",
}


@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
def test_the_echo_of_a_deliberate_stop_after_serving_is_healthy(stop: str) -> None:
    result = analyzed([*READY, stop, HANDLER, *ECHO, f"{CORE}Worker proc VllmWorker-1 died unexpectedly"])
    assert result.first_error is None and result.healthy
    assert any(reason.startswith("stop: line 5 stopped a serving server on purpose") for reason in result.why)


def test_a_log_of_vllms_own_stream_alone_knows_it_was_serving() -> None:
    """`vllm serve ... > log`: uvicorn's `Application startup complete` went to the other stream. vLLM's own
    last start-up line marks readiness; the stop's EngineDeadError (0.32 logs it after the stop notice) is its echo."""
    stdout_only = [
        READY[0],
        READY[1],
        f"{API}INFO 11-05 03:10:40 [api_server.py:1800] Starting vLLM server on http://0.0.0.0:8000",
        f"{API}INFO 11-05 03:10:40 [launcher.py:40] Available routes are:",
        READY[3],
        STOPS["engine signal"],
        HANDLER,
        *ECHO,
    ]
    result = analyzed(stdout_only)
    assert result.first_error is None and result.healthy
    assert result.phases_seen[-1] == "request"


def test_an_error_after_vllms_last_start_up_line_is_a_request_error() -> None:
    lines = [
        READY[0],
        READY[1],
        f"{API}INFO 11-05 03:10:40 [api_server.py:1800] Starting vLLM API server 0 on http://h:8000",
    ]
    error = first([*lines, HANDLER, *ECHO])
    assert (error.line, error.phase) == (HANDLER, "request")


def test_a_keyboard_interrupt_of_a_serving_server_is_a_stop() -> None:
    interrupt = traceback("", ["main", "run_server", "serve_http"], "KeyboardInterrupt")
    result = analyzed([*READY, *interrupt, *ECHO, "asyncio.exceptions.CancelledError"])
    assert result.first_error is None and result.healthy


def test_a_crash_while_serving_is_not_hidden_by_the_engine_dead_error_and_shutdown_after_it() -> None:
    crash = traceback(
        W, ["worker_busy_loop", "execute_model"], "RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    lines = [*READY, *crash, HANDLER, *ECHO, f"{API}INFO:     Shutting down"]
    error = first(lines)
    assert (error.line, error.phase) == (crash[-1], "request")


def test_an_engine_dead_error_without_a_stop_before_it_is_a_failure() -> None:
    error = first([*READY, HANDLER, *ECHO])
    assert (error.line, error.phase) == (HANDLER, "request")


def test_a_stop_before_readiness_hides_nothing() -> None:
    lines = [
        READY[0],
        STOPS["uvicorn"],
        *traceback(CORE, ["run_engine_core", "init_device"], "RuntimeError: NCCL error: x"),
    ]
    assert first(lines).category == "nccl_comm"


def test_a_new_launch_after_a_stop_is_analyzed_again() -> None:
    relaunch = READY[0].replace("0.12.0", "0.12.1")
    lines = [*READY, STOPS["shutdown marker"], *ECHO, relaunch, f"{CORE}ValueError: Unknown quantization method: fp5"]
    error = first(lines)
    assert (error.line, error.phase, error.category) == (lines[-1], "gpu_detect", "model_config")


# --- the fast path --------------------------------------------------------------------------------


def test_a_serving_log_full_of_cuda_graph_and_nccl_lines_stays_on_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("hyperscan")
    from kernel.analyzer import StreamAnalyzer

    repeated = [
        "(EngineCore_DP0 pid=4300) DEBUG 11-05 03:20:00 [cuda_graph.py:180] Capturing a cudagraph on (PIECEWISE, 8)",
        "(Worker_TP1 pid=4411) INFO 11-05 03:20:00 [pynccl.py:70] vLLM is using nccl==2.27.3",
        f'{API}INFO:     10.0.0.9:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        f"{API}INFO 11-05 03:20:00 [loggers.py:123] Engine 000: Avg prompt throughput: 9.0 tokens/s, Running: 1 reqs",
    ]
    start = [READY[0], repeated[1], *READY[1:]]
    data = (
        "\n".join([*start, *repeated * 1000, f"{CORE}RuntimeError: NCCL error: remote process exited"]) + "\n"
    ).encode()
    fed: list[str] = []
    original = StreamAnalyzer.feed
    monkeypatch.setattr(
        StreamAnalyzer, "feed", lambda self, line, at=None: fed.append(line) or original(self, line, at)
    )
    result = analyze_stream(io.BytesIO(data))
    assert result.first_error is not None and result.first_error.category == "nccl_comm"
    assert len(fed) < 20  # the repeated lines are jumped over once they cannot change anything


# --- a cause on the line after the error ----------------------------------------------------------


def _config_error(cause: str, prefix: str = "") -> list[str]:
    return [
        f"{prefix}INFO 11-05 03:10:00 [api_server.py:1100] vLLM API server version 0.32.0",
        *traceback(
            prefix,
            ["run_server", "create_engine_config", "create_model_config"],
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        ),
        f"{prefix}  Value error, {cause} [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]",
        f"{prefix}    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
    ]


@pytest.mark.parametrize("prefix", ["", API])
def test_a_config_validation_error_keeps_the_line_that_names_its_cause(prefix: str) -> None:
    too_long = first(_config_error("User-specified max_model_len (100000) is greater than the derived one", prefix))
    unknown = first(_config_error("Model architectures ['NoSuchForCausalLM'] are not supported for now.", prefix))
    for error in (too_long, unknown):
        assert (error.phase, error.category) == ("gpu_detect", "model_config")
        assert error.line.endswith("1 validation error for ModelConfig")  # the line stays the exception's
    assert "User-specified max_model_len" in too_long.signature and "NoSuchForCausalLM" in unknown.signature
    assert too_long.signature != unknown.signature


def test_a_config_validation_error_without_its_cause_line_still_counts() -> None:
    lines = _config_error("x")[:-2]
    error = first(lines)
    assert error.category == "model_config" and error.signature.endswith("validation error for ModelConfig")
