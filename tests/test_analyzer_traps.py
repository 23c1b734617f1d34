"""Hand-written logs for the traps of issue 3: wrappers after the root cause, interleaved ranks, secondary
OOMs, phases from the error itself, prefixes, progress bars and collector wrappers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kernel.analyzer import analyze_path, analyze_text, default_rules
from kernel.analyzer.lines import LineParser
from tests.test_analyzer_support import traceback

CORE = "(EngineCore_DP0 pid=68) "
CORE_ERR = "(EngineCore_DP0 pid=68) ERROR 07-01 09:41:21 [core.py:936] "
API = "(APIServer pid=1) "
API_ERR = "(APIServer pid=1) ERROR 07-01 09:41:22 [async_llm.py:704] "
STARTUP = [
    f"{API}INFO 07-01 09:40:00 [utils.py:278] non-default args: {{'model': 'm', 'tensor_parallel_size': 2}}",
    f"{CORE}INFO 07-01 09:40:05 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='m'",
    "(Worker_TP0 pid=70) INFO 07-01 09:40:09 [gpu_model_runner.py:2602] Starting to load model m...",
    "(Worker_TP0 pid=70) INFO 07-01 09:41:00 [default_loader.py:267] Loading weights took 51.00 seconds",
]
NCCL_ROOT = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
ROOT_TB = traceback(CORE_ERR, ["run_engine_core", "init_device", "ncclCommInitRank"], NCCL_ROOT)
ROOT_LINE = ROOT_TB[-1]

WRAPPERS = {
    "engine_dead": traceback(
        API_ERR,
        ["output_handler"],
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
        "for the root cause.",
    ),
    "engine_core_init_failed": traceback(
        API,
        ["wait_for_engine_startup"],
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}",
    ),
    "workerproc_init_failed": [
        "(Worker_TP1 pid=71) ERROR 07-01 09:41:23 [multiproc_executor.py:888] WorkerProc initialization failed.",
        *traceback(
            "(Worker_TP1 pid=71) ERROR 07-01 09:41:23 [multiproc_executor.py:888] ",
            ["worker_main"],
            "RuntimeError: WorkerProc initialization failed due to an exception in a background process.",
        ),
    ],
    "executor_failed": traceback(CORE, ["_init_executor"], "RuntimeError: Executor failed."),
    "ray_actor_died": [
        "(RayWorkerWrapper pid=880, ip=10.0.0.2) ERROR 07-01 09:41:23 [worker_base.py:620] Error executing method "
        "'init_device'. This might cause deadlock in distributed execution.",
        "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.",
    ],
    "nccl_watchdog": [
        "[rank0]:[E701 09:51:21.000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds "
        "before timing out.",
    ],
    "worker_died": [
        f"{CORE}ERROR 07-01 09:41:24 [multiproc_executor.py:314] Worker proc VllmWorker-1 died unexpectedly "
        "(exit code: -6), shutting down executor.",
    ],
}


@pytest.mark.parametrize("wrapper", WRAPPERS.values(), ids=WRAPPERS.keys())
def test_wrapper_after_the_root_cause_is_not_the_first_error(wrapper: list[str]) -> None:
    result = analyze_text("\n".join([*STARTUP, *ROOT_TB, *wrapper]))
    assert result.first_error is not None
    assert result.first_error.line == ROOT_LINE
    assert result.first_error.category == "nccl_comm"
    assert result.first_error.phase == "gpu_detect"  # the init_device frame places it


BEFORE = {k: v for k, v in WRAPPERS.items() if k != "nccl_watchdog"}  # a watchdog fires minutes later


@pytest.mark.parametrize("wrapper", BEFORE.values(), ids=BEFORE.keys())
def test_wrapper_printed_before_the_root_cause_is_not_the_first_error(wrapper: list[str]) -> None:
    result = analyze_text("\n".join([*STARTUP, *wrapper, *ROOT_TB]))
    assert result.first_error is not None
    assert result.first_error.line == ROOT_LINE


def test_a_wrapper_alone_is_reported_as_a_last_resort() -> None:
    result = analyze_text("\n".join([*STARTUP, *WRAPPERS["worker_died"]]))
    assert result.first_error is not None
    assert result.first_error.line == WRAPPERS["worker_died"][0]
    assert result.first_error.category == "other"


def test_nccl_watchdog_alone_is_a_communication_failure() -> None:
    result = analyze_text("\n".join(WRAPPERS["nccl_watchdog"]))
    assert result.first_error is not None
    assert result.first_error.category == "nccl_comm"


def test_interleaved_ranks_earliest_root_cause_wins() -> None:
    tp0 = traceback(
        "(Worker_TP0 pid=70) ERROR 07-01 09:41:21 [multiproc_executor.py:949] ",
        ["worker_main", "capture_model"],
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    )
    tp1 = traceback(
        "(Worker_TP1 pid=71) ERROR 07-01 09:41:21 [multiproc_executor.py:949] ",
        ["worker_main", "capture_model"],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    )
    # TP1's traceback starts later but its exception line comes first.
    lines = [tp0[0], *tp1[:-1], tp1[-1], *tp0[1:]]
    result = analyze_text("\n".join([*STARTUP, *lines]))
    assert result.first_error is not None
    assert result.first_error.line == tp1[-1]
    assert (result.first_error.category, result.first_error.phase) == ("oom", "engine_init")
    assert not result.first_error.secondary_oom


def test_oom_after_a_different_first_error_is_secondary() -> None:
    oom = traceback(
        "(Worker_TP1 pid=71) ",
        ["worker_main", "load_model"],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 1 has a total capacity of 79 GiB",
    )
    result = analyze_text("\n".join([*STARTUP, *ROOT_TB, *oom]))
    assert result.first_error is not None
    assert result.first_error.line == ROOT_LINE
    assert result.first_error.category == "nccl_comm"
    assert result.first_error.secondary_oom
    assert "nvidia-smi --query-compute-apps" in result.first_error.hint
    assert result.to_json()["secondary_oom"] is True


def test_free_memory_less_than_desired_is_a_secondary_oom_at_gpu_detect() -> None:
    line = (
        "(Worker pid=148) ERROR 07-01 02:36:18 [multiproc_executor.py:870] ValueError: Free memory on device "
        "cuda:0 (22.35/23.56 GiB) on startup is less than desired GPU memory utilization (0.95, 22.38 GiB). "
        "Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    result = analyze_text(line)
    assert result.to_json() | {"hint": None, "signature": None, "phase_from": None, "confidence": None} == {
        "phase": "gpu_detect",
        "first_error": {"line": line, "lineno": 1},
        "category": "oom",
        "secondary_oom": True,
        "hint": None,
        "phases_seen": [],
        "signature": None,
        "phase_from": None,
        "confidence": None,
    }
    assert "other or leftover processes" in (result.first_error.hint if result.first_error else "")


@pytest.mark.parametrize(
    ("line", "phase", "category"),
    [
        # NCCL fails at start-up and while serving alike: one line alone does not say which.
        (NCCL_ROOT, "unknown", "nccl_comm"),
        (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when initializing the engine.",
            "engine_init",
            "kv_cache_capacity",
        ),
        # a bind fails in any process (the API server's, a worker's, a KV connector's): alone it places nothing
        ("OSError: [Errno 98] Address already in use", "unknown", "port_in_use"),
        (
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
            "api_listen",
            "port_in_use",
        ),
        (
            "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.8, please update your "
            "driver to a newer version, or use an earlier cuda container: unknown",
            "container_init",
            "driver_cuda_init",
        ),
        (
            'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].',
            "container_init",
            "driver_cuda_init",
        ),
    ],
)
def test_phase_from_the_error_itself_without_markers(line: str, phase: str, category: str) -> None:
    """Errors that can only happen in one phase place themselves; the others are `unknown` alone."""
    result = analyze_text(line)
    assert result.first_error is not None
    assert (result.first_error.phase, result.first_error.category, result.first_error.line) == (phase, category, line)


def test_address_in_use_is_api_listen_even_after_engine_markers() -> None:
    port = traceback("", ["run_server", "create_server_socket"], "OSError: [Errno 98] Address already in use")
    result = analyze_text("\n".join([*STARTUP, *port]))
    assert result.first_error is not None
    assert result.first_error.phase == "api_listen"
    assert "leftover" in result.first_error.hint


def test_nested_prefixes() -> None:
    line = (
        "(APIServer pid=1) (EngineCore_DP0 pid=68) ERROR 07-01 09:41:21 [core.py:936] "
        "ValueError: No available memory for the cache blocks."
    )
    marker = "(APIServer pid=1) (EngineCore_DP0 pid=68) INFO 07-01 09:41:00 [gpu_worker.py:298] Available KV cache memory: 0.00 GiB"
    result = analyze_text(f"{marker}\n{line}")
    assert result.phases_seen == ("engine_init",)
    assert result.first_error is not None
    assert result.first_error.line == line
    assert result.first_error.category == "kv_cache_capacity"


def test_progress_bars_with_carriage_returns() -> None:
    bars = "".join(f"\rCapturing CUDA graphs (decode, FULL): {p:3d}%|##| {p}/100 [00:01<00:00]" for p in (0, 50, 99))
    lines = [
        *STARTUP,
        f"(Worker_TP0 pid=70) {bars}",
        "(Worker_TP0 pid=70) \rLoading safetensors checkpoint shards: 100% Completed | 4/4 [00:02<00:00]",
        "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:164 'invalid argument'",
    ]
    result = analyze_text("\r\n".join(lines) + "\r\n")
    assert result.first_error is not None
    assert result.first_error.line == lines[-1]  # the CR of the Windows line end is not part of it
    assert (result.first_error.phase, result.first_error.category) == ("engine_init", "cudagraph")
    assert "--enforce-eager" in result.first_error.hint


def test_ansi_colours_display_like_the_labels() -> None:
    raw = "\x1b[1;36m(EngineCore_DP0 pid=114700)\x1b[0;0m ERROR 07-31 15:52:26 [core.py:708] RuntimeError: CUDA error: no kernel image is available for execution on the device"
    result = analyze_text(raw)
    assert result.first_error is not None
    assert result.first_error.line == raw.split("\x1b[0;0m ")[1]
    assert result.first_error.category == "driver_cuda_init"  # no kernels for this GPU (tests/corpus/README.md)


@pytest.mark.parametrize(
    "wrap",
    [
        "vllm-1  | {}",
        "INFO 2025-11-19T20:16:36.096Z [resource.labels.containerName: vllm] {}",
        "2025-11-19T20:16:36.096638074Z {}",
        "2025-11-19T20:16:36.096638074+00:00 stdout F {}",
        "Nov 19 20:16:36 gpu-a1 vllm[4242]: {}",
        "2025-11-19T20:16:36+0000 gpu-a1 vllm[4242]: {}",
        "> {}",
        "> > {}",
        "2025-06-06T19:02:40.751Z DEBUG dynamo_run::subprocess: {}",
        "2025-06-06 19:02:40.123\t{}",
        "2025/06/06 19:02:40 {}",
        "[2025-06-06 19:02:40] {}",
        "| 2025-11-03 11:57:01 | {} |",
    ],
    ids=[
        "docker-compose",
        "cloud-logging",
        "docker-logs-t",
        "cri-log-file",
        "journalctl",
        "journalctl-short-iso",
        "markdown-quote",
        "markdown-quote-nested",
        "tracing-relogger",
        "timestamp-tab",
        "timestamp-go",
        "timestamp-bracketed",
        "markdown-table",
    ],
)
def test_collector_wrappers_are_stripped(wrap: str) -> None:
    lines = [wrap.format(line) for line in [*STARTUP, *ROOT_TB]]
    result = analyze_text("\n".join(lines))
    assert result.phases_seen == ("gpu_detect", "weight_load", "engine_init")
    assert result.first_error is not None
    assert result.first_error.line == lines[-1]
    assert result.first_error.category == "nccl_comm"
    # what is left once the wrapper goes is vLLM's own line: its process, level and call site
    parsed = LineParser(default_rules().line).parse(
        wrap.format("(Worker_TP1 pid=7) ERROR 11-19 20:16:36 [core.py:866] x")
    )
    assert (parsed.proc, parsed.level, parsed.src, parsed.msg) == ("(Worker_TP1 pid=7)", "ERROR", "core.py:866", "x")


def test_v0_error_header_repeating_the_exception_is_the_root_line() -> None:
    err = "ERROR 04-18 14:47:42 engine.py:389] "
    header = f"{err}Tensor parallel group could not be formed within 300 seconds."
    lines = [
        header,
        *traceback(err, ["run_mp_engine"], "ValueError: Tensor parallel group could not be formed within 300 seconds."),
    ]
    result = analyze_text("\n".join(lines))
    assert result.first_error is not None
    assert result.first_error.line == header
    assert result.first_error.category == "other"


def test_error_header_not_repeating_the_exception_gives_the_exception_line() -> None:
    err = "(APIServer pid=1) ERROR 08-18 19:58:43 [serving_chat.py:203] "
    lines = [
        "(APIServer pid=1) INFO:     Application startup complete.",
        f"{err}Error in preprocessing prompt inputs",
        *traceback(err, ["create_chat_completion"], "KeyError: 'messages'"),
    ]
    result = analyze_text("\n".join(lines))
    assert result.first_error is not None
    assert result.first_error.line == lines[-1]
    assert (result.first_error.phase, result.first_error.category) == ("request", "request_error")


def test_harmless_error_lines_keep_a_healthy_log_healthy() -> None:
    lines = [
        *STARTUP,
        f"{CORE}ERROR 07-31 15:52:18 [fa_utils.py:57] Cannot use FA version 2 is not supported due to FA2 is only supported on devices with compute capability >= 8",
        "(APIServer pid=1) ERROR 02-09 12:40:16 [repo_utils.py:47] Error retrieving safetensors: Repo id must use alphanumeric chars",
        "(APIServer pid=1) INFO:     Application startup complete.",
    ]
    result = analyze_text("\n".join(lines))
    assert result.healthy
    assert result.first_error is None
    assert result.to_json() == {
        "phase": None,
        "first_error": None,
        "category": None,
        "secondary_oom": False,
        "hint": None,
        "phases_seen": ["gpu_detect", "weight_load", "engine_init", "api_listen"],
        "signature": "",
        "phase_from": None,
        "confidence": None,
    }


def test_kv_cache_hint_names_the_estimated_max_model_len() -> None:
    line = (
        "ValueError: To serve at least one request with the model's max seq len (262144), (24.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (3.18 GiB). Based on the available memory, "
        "the estimated maximum model length is 34736. Try increasing `gpu_memory_utilization`."
    )
    result = analyze_text(line)
    assert result.first_error is not None
    assert "--max-model-len 34736" in result.first_error.hint


def test_driver_hint_points_at_the_cuda_ceiling() -> None:
    result = analyze_text("RuntimeError: The NVIDIA driver on your system is too old (found version 12020).")
    assert result.first_error is not None
    assert (result.first_error.category, result.first_error.phase) == ("driver_cuda_init", "gpu_detect")
    assert "CUDA ceiling" in result.first_error.hint


def test_error_after_readiness_is_in_the_request_phase() -> None:
    lines = [
        *STARTUP,
        "(APIServer pid=1) INFO:     Application startup complete.",
        *traceback(
            CORE_ERR,
            ["run_busy_loop", "execute_model"],
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ),
    ]
    result = analyze_text("\n".join(lines))
    assert result.first_error is not None
    assert (result.first_error.phase, result.first_error.category) == ("request", "request_error")


def test_oom_while_waking_from_sleep_mode_is_secondary() -> None:
    lines = [
        "(APIServer pid=1) INFO:     Application startup complete.",
        "(APIServer pid=1) INFO 06-02 14:31:00 [api_router.py:39] wake up the engine with tags: None",
        "CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:139",
    ]
    result = analyze_text("\n".join(lines))
    assert result.first_error is not None
    assert (result.first_error.category, result.first_error.secondary_oom) == ("oom", True)


def test_new_launch_in_the_same_log_resets_the_phase() -> None:
    lines = [
        *STARTUP,
        "INFO 06-20 20:03:41 [api_server.py:1287] vLLM API server version 0.9.1",
        "ValueError: Something unexpected happened in the second launch",
    ]
    result = analyze_text("\n".join(lines))
    assert result.first_error is not None
    assert result.first_error.phase == "gpu_detect"


def test_a_kernel_fault_while_serving_points_at_the_kernel_not_at_the_request() -> None:
    log = (
        "(APIServer pid=1) INFO:     Application startup complete.\n"
        "(Worker_TP0 pid=9) ERROR 05-12 02:50:01 [multiproc_executor.py:941] "
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    )
    error = analyze_text(log).first_error
    assert error is not None and (error.phase, error.category) == ("request", "request_error")
    assert "CUDA_LAUNCH_BLOCKING=1" in error.hint and "--max-model-len" not in error.hint


def test_logfmt_values_are_read_unquoted(tmp_path: Path) -> None:
    # Docker Model Runner re-logs vLLM's stderr as logfmt values, quotes escaped.
    lines = [
        'time="2026-01-29T14:55:54Z" level=info msg="{}" component=vllm'.format(line.replace('"', '\\"'))
        # (an excerpt that starts inside a process's own traceback)
        for line in [f"{CORE}{line.removeprefix(CORE_ERR)}" for line in ROOT_TB[1:]]
    ]
    noise = ['time="2026-01-29T14:55:50Z" level=info msg="waiting" component=vllm'] * 200
    log = tmp_path / "logfmt.log"
    log.write_text("\n".join([*noise, *lines]) + "\n", encoding="utf-8")
    # (whole-file analysis jumps to the lines with the patterns' literals: a quote in one may be escaped)
    for result in (analyze_text("\n".join(lines)), analyze_path(log)):
        assert result.first_error is not None
        assert (result.first_error.line, result.first_error.category) == (lines[-1], "nccl_comm")
        assert result.first_error.phase == "gpu_detect"  # by the frames (init_device), read once unquoted


@pytest.mark.parametrize(
    ("line", "level", "src"),
    [
        ("[2025-01-23 01:25:24,152] LMCache ERROR: x (cache_engine.py:423:lmcache)", "ERROR", ""),
        ("[2025-03-01 12:00:00,123] ERROR: x (router.py:88:vllm_router)", "ERROR", ""),
        ("[ERROR|2025-05-10 12:34:56] llamafactory.model.loader:143 >> x", "ERROR", "llamafactory.model.loader:143"),
        ("[WARNING|logging.py:328] 2025-05-10 12:34:56,789 >> x", "WARNING", "logging.py:328"),
        ("ERROR 2025-01-01 12:00:00,123 default_LLMServer abc123 replica.py:1234 - x", "ERROR", "replica.py:1234"),
        ("2025-06-06 19:02:40,123\tERROR worker.py:409 -- x", "ERROR", "worker.py:409"),
        ("2025-06-27 12:57:51,690 - __main__ - ERROR - x", "ERROR", "__main__"),
        ("[2025-06-27 12:57:51,690] ERROR core.py:12 x", "ERROR", "core.py:12"),
        ("2025-06-06T09:52:01.833Z ERROR core.run_engine_core: x", "ERROR", ""),
        ("`ERROR [hermes_tool_parser.py:110] x", "ERROR", "hermes_tool_parser.py:110"),
        ("[ERROR:swift] x", "ERROR", "swift"),
    ],
    ids=[
        "lmcache",
        "production-stack",
        "llamafactory",
        "transformers",
        "ray-serve",
        "ray",
        "python-logging",
        "bracketed",
        "tracing-error",
        "code-span",
        "ms-swift",
    ],
)
def test_log_headers_of_the_tools_that_deploy_vllm(line: str, level: str, src: str) -> None:
    parsed = LineParser(default_rules().line).parse(line)
    assert (parsed.level, parsed.src) == (level, src)
    assert parsed.msg.startswith("x")


@pytest.mark.parametrize(
    "proc",
    [
        "(ServeReplica:default:LLMServer pid=77)",
        "(MapWorker(MapBatches(vLLMEngineStageUDF)) pid=9, ip=10.0.0.1)",
        "(raylet, ip=10.0.0.1)",
        "(WorkerDict pid=1790, ip=10.0.0.1)",
    ],
)
def test_ray_actor_prefixes_are_process_prefixes(proc: str) -> None:
    parsed = LineParser(default_rules().line).parse(f"{proc} ERROR 11-19 20:16:36 [core.py:866] x")
    assert (parsed.proc, parsed.level, parsed.msg) == (proc, "ERROR", "x")


def test_a_linker_error_before_the_engine_failed_to_start_is_the_root_cause() -> None:
    lines = [
        *STARTUP,
        f"{CORE}INFO 07-01 09:41:05 [backends.py:430] Dynamo bytecode transform time: 13.06 s",
        "/usr/bin/ld: cannot find -lcuda: No such file or directory",
        "collect2: error: ld returned 1 exit status",
        f"{CORE_ERR}EngineCore failed to start.",
        *traceback(CORE_ERR, ["run_engine_core", "_initialize_kv_caches"], "subprocess.CalledProcessError: x"),
    ]
    result = analyze_text("\n".join(lines))
    assert result.first_error is not None
    assert result.first_error.line == lines[len(STARTUP) + 1]
    assert (result.first_error.phase, result.first_error.category) == ("engine_init", "compile")


def test_a_kernel_whose_ptx_cannot_be_loaded_is_placed_only_by_the_log() -> None:
    error = "torch.AcceleratorError: CUDA error: the provided PTX was compiled with an unsupported toolchain."
    alone = analyze_text(error).first_error
    assert alone is not None and (alone.phase, alone.category) == ("unknown", "ptx_toolchain")
    startup = traceback(CORE_ERR, ["run_engine_core", "_initialize_kv_caches", "forward"], error)
    placed = analyze_text("\n".join(startup)).first_error
    assert placed is not None and (placed.phase, placed.category) == ("engine_init", "ptx_toolchain")


def test_a_compile_time_traceback_is_a_compile_failure_wherever_it_ran() -> None:
    frames = [
        '  File "/opt/conda/lib/python3.10/site-packages/torch/_dynamo/convert_frame.py", line 986, in _compile',
        "    guarded_code = compile_inner(code, one_graph, hooks, transform)",
        '  File "/opt/conda/lib/python3.10/site-packages/torch/_inductor/compile_fx.py", line 1741, in fw_compiler_base',
        "    return inner_compile(",
    ]
    result = analyze_text("\n".join(f"{CORE_ERR}{line}" for line in frames))
    assert result.first_error is not None
    assert (result.first_error.phase, result.first_error.category) == ("unknown", "compile")
    # a compiled graph that runs (eval_frame, aot_autograd's forward) is no compilation
    running = [
        '  File "/usr/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py", line 838, in _fn',
        "    return fn(*args, **kwargs)",
        '  File "/usr/lib/python3.12/site-packages/torch/_functorch/aot_autograd.py", line 1209, in forward',
    ]
    ran = analyze_text("\n".join(f"{CORE_ERR}{line}" for line in running)).first_error
    assert ran is not None and ran.category == "other"


def test_a_notebook_traceback_is_read_like_a_script_one() -> None:
    lines = [
        "---------------------------------------------------------------------------",
        "ValueError                                Traceback (most recent call last)",
        "Cell In[3], line 3",
        "      1 from vllm import LLM",
        "----> 3 llm = LLM(model='m')",
        "",
        "File /usr/local/lib/python3.10/site-packages/vllm/v1/worker/gpu_worker.py:160, in Worker.init_device(self)",
        "    158     torch.cuda.set_device(self.device)",
        "--> 160 current_platform.check_if_supports_dtype(self.model_config.dtype)",
        "",
        "ValueError: the GPU's dtype check failed",
    ]
    result = analyze_text("\n".join(lines))
    assert result.first_error is not None
    assert (result.first_error.line, result.first_error.phase) == (lines[-1], "gpu_detect")


def test_serving_frames_of_parsers_and_generation_place_the_request() -> None:
    for frame in (
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py",'
        " line 88, in extract_tool_calls",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/llm.py", line 390, in generate',
        "    lambda _: future.result(), scheduler_output)",
    ):
        lines = ["Traceback (most recent call last):", frame, "json.decoder.JSONDecodeError: Extra data: line 3"]
        error = analyze_text("\n".join(lines)).first_error
        assert error is not None and (error.phase, error.category) == ("request", "request_error"), frame


def test_a_traceback_re_logged_at_info_is_read_as_the_traceback() -> None:
    # A wrapper script logs vLLM's output line by line through its own logger, at INFO.
    head = "2025-06-27 12:57:51,690 - __main__ - INFO - "
    # vLLM's logged lines (their own prefix and header inside), a process's own traceback (prefix, no header; none)
    bare = [line.removeprefix(CORE_ERR) for line in ROOT_TB]
    for traceback_lines in (ROOT_TB, [f"{CORE}{line}" for line in bare], bare):
        lines = [f"{head}{line}" for line in traceback_lines]
        result = analyze_text("\n".join([f"{head}Starting the server", *lines]))
        assert result.first_error is not None
        assert (result.first_error.line, result.first_error.category) == (lines[-1], "nccl_comm")
        assert result.first_error.phase == "gpu_detect"  # by its frames (init_device)
    # the vLLM banner's indented art at INFO stays an INFO line
    banner = LineParser(default_rules().line).parse("INFO 07-01 09:38:56 [api_utils.py:339]        █     █     █▄   ▄█")
    assert banner.level == "INFO"


def test_a_cut_traceback_is_placed_by_the_process_traceback_right_after_it() -> None:
    # The engine core's logged traceback is cut inside a worker thread's frames; the process then prints its own
    # traceback of the same exception, whose frames show the busy loop: it was serving.
    thread = '  File "/usr/lib/python3.12/concurrent/futures/thread.py", line 59, in run'
    lines = [
        f"{CORE_ERR}{thread}",
        f"{CORE_ERR}    result = self.fn(*self.args, **self.kwargs)",
        f'{CORE}  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 728, in run_busy_loop',
        f"{CORE}    scheduler_output = self.scheduler.schedule()",
    ]
    error = analyze_text("\n".join(lines)).first_error
    assert error is not None and error.line == lines[0]
    assert (error.phase, error.phase_from, error.category) == ("request", "frames_after", "request_error")
    alone = analyze_text("\n".join(lines[:2])).first_error
    assert alone is not None and alone.phase == "unknown"


def test_an_error_raised_by_vllm_s_configuration_checks_refuses_the_configuration() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line 1075, in create_engine_config',
        "    cache_config = CacheConfig(",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/config/cache.py", line 120, in __post_init__',
        "    self._verify_args()",
        "ValueError: the KV cache dtype fp8_e5m2 is not supported with this attention backend",
    ]
    error = analyze_text("\n".join(lines)).first_error
    assert error is not None and (error.phase, error.category) == ("gpu_detect", "model_config")


def test_a_paste_that_joined_its_lines_is_read_line_by_line(tmp_path: Path) -> None:
    # Markdown outside a code block joins a paragraph's lines: the joined line holds the logged lines.
    joined = " ".join([STARTUP[0], *ROOT_TB])
    log = tmp_path / "joined.log"
    log.write_text(joined + "\n", encoding="utf-8")
    for result in (analyze_text(joined), analyze_path(log)):
        assert result.first_error is not None
        assert (result.first_error.line, result.first_error.line_no) == (joined, 1)
        assert (result.first_error.phase, result.first_error.category) == ("gpu_detect", "nccl_comm")
    # a process prefix and its header, or a re-logged line after a header, are one line's own parts
    parser = LineParser(default_rules().line)
    assert len(parser.lines(ROOT_TB[-1])) == 1
    assert len(parser.lines(f"{CORE_ERR}{CORE_ERR}x")) == 1


def test_a_warned_root_cause_is_the_error_only_when_a_later_error_follows(tmp_path: Path) -> None:
    # vLLM warns that its CUDA kernels cannot load (no driver in the container) and runs on; what fails next
    # (here the CLI's parser) follows from it. A log where nothing fails after the warning stays healthy.
    warning = (
        "kserve-container WARNING 09-02 06:44:03 [_custom_ops.py:20] Failed to import from vllm._C with "
        "ImportError('libcuda.so.1: cannot open shared object file: No such file or directory')"
    )
    later = traceback("kserve-container ", ["make_arg_parser"], "RuntimeError: Device string must not be empty")
    log = tmp_path / "warned.log"
    log.write_text("\n".join([warning, *later]) + "\n", encoding="utf-8")
    for result in (analyze_text("\n".join([warning, *later])), analyze_path(log)):
        error = result.first_error
        assert error is not None and error.line == warning
        assert (error.phase, error.category) == ("gpu_detect", "driver_cuda_init")
    assert analyze_text("\n".join([warning, *STARTUP])).first_error is None


def test_a_ray_task_s_cut_traceback_is_named_by_its_task_line_and_a_trainer_s_weight_sync_is_serving() -> None:
    actor = "(LLMRayActor pid=21921, ip=10.39.1.20) "
    lines = [
        f"{actor}Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::RayWorkerWrapper.execute_method()"
        " (pid=22065, ip=10.39.1.20, actor_id=35de96, repr=<vllm.executor.ray_utils.RayWorkerWrapper object>)",
        f'{actor}  File "/env/lib/python3.10/site-packages/vllm/worker/worker_base.py", line 566, in execute_method'
        " [repeated 14x across cluster]",
        f"{actor}    raise e [repeated 7x across cluster]",
        f'{actor}  File "/repo/openrlhf/trainer/ray/vllm_worker_wrap.py", line 23, in init_process_group'
        " [repeated 7x across cluster]",
    ]
    error = analyze_text("\n".join(lines)).first_error
    assert error is not None and error.line == lines[0]
    assert (error.phase, error.category) == ("request", "nccl_comm")


def test_a_terminal_s_hard_wrap_is_read_as_the_lines_it_cut(tmp_path: Path) -> None:
    # Copied from an 80-column terminal: a frame line and the exception line continue on unprefixed lines.
    api = "(APIServer pid=1068) "
    full = [
        f"{api}Traceback (most recent call last):",
        f'{api}  File "/app/.local/lib/python3.12/site-packages/vllm/engine/arg_utils.py", line 2224, in create_engine_config',
        f"{api}    config = VllmConfig(",
        f"{api}pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
    ]
    wrapped = []
    for line in full:
        chunks = [line[i : i + 80].rstrip(" ") for i in range(0, len(line), 80)]
        wrapped += chunks
    assert len(wrapped) > len(full)
    log = tmp_path / "wrapped.log"
    log.write_text("\n".join(wrapped) + "\n", encoding="utf-8")
    for result in (analyze_text("\n".join(wrapped)), analyze_path(log)):
        error = result.first_error
        assert error is not None and error.line == wrapped[-2]
        assert (error.phase, error.category) == ("gpu_detect", "model_config")


def test_loguru_and_bracketed_levels_are_log_headers() -> None:
    # Deploying projects' own loggers: loguru's columns (its level column is no compose service's `name | `; below
    # ERROR, a re-logged line is read as its own) and a bracketed level after a collector's timestamp.
    parser = LineParser(default_rules().line)
    loguru = parser.parse("2025-06-06 19:02:40.123 | ERROR    | swift.llm.infer:main:42 - RuntimeError: boom")
    assert (loguru.level, loguru.src, loguru.msg) == ("ERROR", "swift.llm.infer:main:42", "RuntimeError: boom")
    relogged = parser.parse(
        "2025-06-06 19:02:40.123 | INFO     | app.runner:log:42 - ERROR 01-01 00:00:00 [core.py:1] x"
    )
    assert (relogged.level, relogged.src, relogged.msg) == ("ERROR", "core.py:1", "x")
    bracketed = parser.parse("[2025-06-06 19:02:40,123] [ERROR] [rollout.py:88] ValueError: x")
    assert (bracketed.level, bracketed.src, bracketed.msg) == ("ERROR", "rollout.py:88", "ValueError: x")
    compose = parser.parse("vllm-1  | INFO 01-01 00:00:00 [core.py:1] x")
    assert (compose.level, compose.msg) == ("INFO", "x")


def test_windows_paths_place_like_posix_ones_and_kserve_s_logger_is_a_header() -> None:
    frame = '  File "C:\\Python\\Lib\\site-packages\\vllm\\v1\\structured_output\\backend_xgrammar.py", line 10, in f'
    error = analyze_text(
        "\n".join(["Traceback (most recent call last):", frame, "    x()", "RuntimeError: boom"])
    ).first_error
    assert error is not None and error.phase == "request"
    kserve = LineParser(default_rules().line).parse("2025-09-02 06:44:03.123 1 kserve ERROR [model_server.py:164] x")
    assert (kserve.level, kserve.src, kserve.msg) == ("ERROR", "model_server.py:164", "x")


def test_a_cuda_message_s_search_for_line_never_wins_over_the_error_line_it_continues() -> None:
    # A wrapper quoting CUDA's message: its `Search for cudaError…` continuation names the cause (driver_cuda_init)
    # but the error is the line it continues; alone, at an excerpt's start, the continuation stands in.
    search = (
        f"{CORE_ERR}Search for `cudaErrorNoKernelImageForDevice' in "
        "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information."
    )
    head = (
        f"{CORE_ERR}RuntimeError: Worker failed with error 'CUDA error: no kernel image is available for execution "
        "on the device"
    )
    error = analyze_text("\n".join([head, search])).first_error
    assert error is not None and (error.line, error.category) == (head, "driver_cuda_init")
    alone = analyze_text(search).first_error
    assert alone is not None and (alone.line, alone.category) == (search, "driver_cuda_init")


def test_a_worker_s_death_after_a_wrapper_quoting_a_cause_is_the_survivors_reaction() -> None:
    # (whether a rule names the cause or not: the wrapper quoting it was there first)
    oom = f"{CORE_ERR}RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 2.96 GiB.', please check"
    died = (
        f"{CORE}ERROR 07-01 09:41:29 [multiproc_executor.py:295] Worker proc VllmWorker-2 died unexpectedly "
        "(exit code: None), shutting down executor."
    )
    error = analyze_text("\n".join([oom, died])).first_error
    assert error is not None and (error.line, error.category) == (oom, "oom")
    # a cause no rule names, quoted by another data-parallel engine core than the one whose worker died
    vague = (
        "(EngineCore_DP1 pid=69) ERROR 07-01 09:41:21 [core.py:718] RuntimeError: Worker failed with error "
        "'kv_cache must be a tuple', please check the stack trace above for the root cause"
    )
    error = analyze_text("\n".join([vague, died])).first_error
    assert error is not None and (error.line, error.category) == (vague, "other")
    causeless = f"{API_ERR}RuntimeError: Engine core initialization failed. See root cause above."
    error = analyze_text("\n".join([causeless, died])).first_error
    assert error is not None and error.line == died


def test_a_kernel_s_device_assertion_is_the_error_before_cuda_reports_it() -> None:
    # The kernel prints its failed assertion (no level, no logger) before torch raises `device-side assert
    # triggered`: the assertion names the fault, the exception only reports it.
    assertion = (
        "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1422: indexSelectLargeIndex: block: [3,0,0], thread: [9,0,0] "
        "Assertion `srcIndex < srcSelectDimSize` failed."
    )
    lines = [
        assertion,
        *traceback(CORE_ERR, ["execute_model"], "RuntimeError: CUDA error: device-side assert triggered"),
    ]
    error = analyze_text("\n".join(lines)).first_error
    assert error is not None and (error.line, error.phase, error.category) == (assertion, "request", "request_error")


@pytest.mark.parametrize(
    ("source", "category"),
    [("with torch.cuda.graph(", "cudagraph"), ("python_create_and_map(*allocation_handle)", "oom")],
)
def test_a_cut_traceback_s_last_source_line_names_its_stretch(source: str, category: str) -> None:
    # Cut inside vLLM's CUDAGraphWrapper at the capture's `with torch.cuda.graph(` (its replay runs through the same
    # wrapper), or inside the CuMem allocator mapping memory: the stretch names the cause no exception line shows.
    lines = [
        f'{CORE_ERR}  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 5, in _dummy_run',
        f"{CORE_ERR}    outputs = self.model(",
        f'{CORE_ERR}  File "/usr/local/lib/python3.12/dist-packages/vllm/compilation/mod.py", line 9, in __call__',
        f"{CORE_ERR}    {source}",
    ]
    error = analyze_text("\n".join(lines)).first_error
    assert error is not None and (error.phase, error.category) == ("engine_init", category)
    replay = analyze_text("\n".join([*lines[:3], f"{CORE_ERR}    entry.cudagraph.replay_step()"])).first_error
    assert replay is not None and replay.category == "other"


def test_the_model_registry_s_inspection_failure_heads_its_subprocess_error() -> None:
    head = "ERROR 10-23 23:20:26 registry.py:272] Error in inspecting model architecture 'MyForCausalLM'"
    tb = traceback(
        "ERROR 10-23 23:20:26 registry.py:272] ",
        ["_run_in_subprocess", "check_returncode"],
        "subprocess.CalledProcessError: Command '['python', '-m', 'vllm.model_executor.models.registry']' returned "
        "non-zero exit status 1.",
    )
    error = analyze_text("\n".join([head, *tb])).first_error
    assert error is not None and (error.line, error.phase, error.category) == (head, "unknown", "model_config")


def test_a_deploying_project_s_logger_with_its_own_date_format_is_a_header() -> None:
    # Python logging's `asctime - name - levelname - ` with microseconds and a zone (GPUStack): an ERROR line whose
    # traceback is the deploying project's own, not a cut traceback named by its last frame.
    head = "2025-12-20 04:38:00.262558+08:00 - app.serve_manager - ERROR - Error provisioning m: Failed to get vLLM backend image"
    lines = [
        "2025-12-20 04:37:58.574872+08:00 - app.backends.vllm - INFO - Starting vLLM model instance: m",
        head,
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.11/dist-packages/app/worker/serve_manager.py", line 422, in _serve_model_instance',
        "    server_ins.start()",
    ]
    error = analyze_text("\n".join(lines)).first_error
    assert error is not None and (error.line, error.phase, error.category) == (head, "container_init", "other")


def test_a_request_the_server_answered_on_any_route_places_serving() -> None:
    # An RL trainer's own routes (trl's vllm-serve): the server answered, so it was up, whatever logged the error.
    nccl = (
        "(VllmWorker rank=3 pid=44710) ERROR 08-20 09:48:31 [pynccl_wrapper.py:229] Failed to load NCCL library from "
        "/opt/nccl/libnccl.so.2."
    )
    for access, phase in (
        ('"POST /init_communicator/ HTTP/1.1" 200 OK', "request"),
        ('"GET /health HTTP/1.1" 200', "gpu_detect"),
    ):
        error = analyze_text("\n".join([f"INFO:     127.0.0.1:50088 - {access}", nccl])).first_error
        assert error is not None and (error.phase, error.category) == (phase, "nccl_comm")


def test_a_wrapper_s_quoted_cause_over_lines_is_named_by_the_line_a_rule_names() -> None:
    # Triton's CompilationError quoted by the engine core's wrapper: `at 1:0:`, the kernel's source, then the
    # message a rule names, each on its own logged line.
    head = f"{CORE_ERR}RuntimeError: Worker failed with error 'at 1:0:"
    rest = [
        f"{CORE_ERR}def fused_moe_kernel(",
        f"{CORE_ERR}^",
        f'{CORE_ERR}ValueError("type fp8e4nv not supported in this architecture.")',
    ]
    error = analyze_text("\n".join([head, *rest])).first_error
    assert error is not None and (error.line, error.category) == (head, "compile")
    vague = analyze_text("\n".join([head, *rest[:2]])).first_error
    assert vague is not None and (vague.line, vague.category) == (head, "other")


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda line: f"  {line}", id="indented-paste"),
        pytest.param(lambda line: f"(TaskRunner pid=7) 2025-06-06 19:02:40,123\t{line}", id="actor-over-timestamp"),
        pytest.param(lambda line: f"  | [2025-03-10T15:07:20Z] {line}", id="table-cell-bracketed-iso"),
        # (a systemd journal in the host's locale: its month is any language's, `déc.`, `Dez`, `12月`)
        pytest.param(lambda line: f"déc. 19 02:07:16 host-1 bash[2211352]: {line}", id="journal-french-month"),
        pytest.param(lambda line: f"Dez 19 02:07:16 host-1 vllm.service[77]: {line}", id="journal-german-month"),
        pytest.param(lambda line: f"12月 19 02:07:16 host-1 python3[77]: {line}", id="journal-cjk-month"),
        # (a wrapper no rule strips: a process's traceback lines are read from their process prefix on)
        pytest.param(lambda line: f"19.12.25 02:07:16,123 host-1 bash[22]: {line}", id="unknown-wrapper"),
    ],
)
def test_wrappers_around_a_prefixed_log_read_as_the_log(wrap: Callable[[str], str]) -> None:
    # A whole paste indented (a code block in a Markdown list), an actor's or rank's output that carries a
    # timestamp of its own, a log viewer's cell: the lines inside are read as they are without them.
    # (the traceback printed, not logged: no header inside the line to find the line's own start by)
    log = [*STARTUP, *traceback(CORE, ["run_engine_core", "init_device", "ncclCommInitRank"], NCCL_ROOT)]
    plain = analyze_text("\n".join(log)).first_error
    wrapped = analyze_text("\n".join(wrap(line) for line in log)).first_error
    assert plain is not None and wrapped is not None
    assert (wrapped.phase, wrapped.category, wrapped.line) == (plain.phase, plain.category, wrap(log[-1]))


def test_an_excerpt_s_first_line_of_source_places_the_traceback_below_it(tmp_path: Path) -> None:
    # A paste that starts on the outermost frame's source line (its `File "…"` line cut): that line names the
    # call, as a logged one does; streaming and whole-file reading (which reads the first line) agree.
    lines = [
        '    self.NCCL_CHECK(self._funcs["ncclCommInitRank"](ctypes.byref(comm),',
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/device_communicators/pynccl_wrapper.py", '
        "line 256, in NCCL_CHECK",
        '    raise RuntimeError(f"NCCL error: {error_str}")',
        "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)",
    ]
    path = tmp_path / "excerpt.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for error in (analyze_text("\n".join(lines)).first_error, analyze_path(path).first_error):
        assert error is not None and (error.phase, error.category) == ("gpu_detect", "nccl_comm")
    later = analyze_text("\n".join(["INFO: a line before it", *lines])).first_error
    assert later is not None and later.phase == "unknown"


def test_an_image_a_request_names_is_no_container_image() -> None:
    pull = 'Warning  Failed  12s  kubelet  Failed to pull image "vllm/vllm-openai:v0.99.0": not found'
    error = analyze_text(pull).first_error
    assert error is not None and (error.phase, error.category) == ("container_init", "other")
    fetch = "ERROR 01-01 00:00:00 [serving_chat.py:1] Failed to get image from http://host/a.png"
    error = analyze_text(fetch).first_error
    assert error is not None and error.phase != "container_init"


@pytest.mark.parametrize(
    ("exception", "category"),
    [
        # out of memory whatever the device or allocator
        ("RuntimeError: NPU out of memory. Tried to allocate 22.00 MiB (NPU 6; 60.97 GiB total capacity)", "oom"),
        ("RuntimeError: HPU out of memory. Tried to allocate 2.00 GiB", "oom"),
        ("RuntimeError: MPS backend out of memory (MPS allocated: 17.86 GB, max allowed: 18.13 GB).", "oom"),
        ("RuntimeError: out of memory", "oom"),
        # a compiler run as a subprocess, by name or path, list or string command
        (
            "subprocess.CalledProcessError: Command '['neuronx-cc', 'compile', '--framework=XLA', 'm.pb']' returned "
            "non-zero exit status 70.",
            "compile",
        ),
        (
            "subprocess.CalledProcessError: Command '['/usr/bin/g++', 'a.cpp']' returned non-zero exit status 1.",
            "compile",
        ),
        ("subprocess.CalledProcessError: Command 'cmake --build build' returned non-zero exit status 2.", "compile"),
        # a JIT's own sources asserting that the command it ran to build or load a kernel succeeded, not its shape checks
        (
            "RuntimeError: Assertion error (csrc/apis/../jit_kernels/impls/../../jit/kernel_runtime.hpp:45): exit_code == 0",
            "compile",
        ),
        ("RuntimeError: Assertion error (/deep_gemm/include/jit/compiler.hpp:120): return_code == 0", "compile"),
        (
            "RuntimeError: Assertion error (csrc/apis/../jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp:30): n % 64 == 0",
            "other",
        ),
        # a config or tokenizer not found
        (
            "ValueError: Could not detect config format for no config file found. With config_format 'auto', ensure "
            "your model has either config.json (HF format) or params.json (Mistral format).",
            "weight_load",
        ),
        ("OSError: /models/m does not appear to have a file named config.json.", "weight_load"),
        # a quantization scheme or method this vLLM does not support
        ("NotImplementedError: No compressed-tensors compatible scheme was found.", "model_config"),
        (
            "ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 80.",
            "model_config",
        ),
    ],
)
def test_a_cause_is_named_whatever_the_device_tool_or_wording(exception: str, category: str) -> None:
    error = analyze_text("\n".join(traceback(CORE_ERR, ["run_engine_core", "step"], exception))).first_error
    assert error is not None and error.category == category


def test_another_process_s_traceback_running_across_an_error_places_it(tmp_path: Path) -> None:
    # Two data-parallel engine cores failing together, their logged tracebacks interleaved: core 1's exception
    # (raised in NCCL_CHECK, which every collective calls) inside core 0's traceback through the communicator's set-up.
    one = "(EngineCore_1 pid=2) ERROR 04-23 21:31:36 [core.py:387] "
    zero = "(EngineCore_0 pid=1) ERROR 04-23 21:31:36 [core.py:387] "
    error = f"{one}RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"
    own = [
        f'{one}  File "/usr/lib/python3.12/site-packages/vllm/distributed/device_communicators/pynccl_wrapper.py", '
        "line 256, in NCCL_CHECK",
        f'{one}    raise RuntimeError(f"NCCL error: {{error_str}}")',
        error,
    ]
    other = [
        f'{zero}  File "/usr/lib/python3.12/site-packages/vllm/distributed/device_communicators/pynccl.py", line 99, '
        "in __init__",
        f"{zero}    self.comm: ncclComm_t = self.nccl.ncclCommInitRank(",
        f"{zero}                            ^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    ]
    interleaved = [own[0], other[0], own[1], other[1], own[2], other[2]]
    path = tmp_path / "interleaved.log"
    path.write_text("\n".join(interleaved) + "\n", encoding="utf-8")
    for found in (analyze_text("\n".join(interleaved)).first_error, analyze_path(path).first_error):
        assert found is not None and (found.line, found.phase, found.category) == (error, "gpu_detect", "nccl_comm")
    # the other traceback over before the error: it says nothing of where this one's process was
    done = "(EngineCore_0 pid=1) INFO 04-23 21:31:36 [core.py:1] a line of its own after it"
    before = analyze_text("\n".join([*other, done, *own])).first_error
    assert before is not None and (before.line, before.phase) == (error, "unknown")


def test_only_the_api_server_s_bind_places_its_listen() -> None:
    # A worker's or a KV connector's bind failing is no API-server listen; the API server's process, its bind of
    # `args.port` or uvicorn's own message are.
    connector = (
        "(Worker_DP0_TP11_EP11 pid=9) ERROR 05-10 13:47:13 [mooncake_connector.py:246] Mooncake KVCacheSendingThread "
        "exception: Address already in use (addr='tcp://10.0.0.7:20013')"
    )
    probe = traceback("", ["get_open_port"], "OSError: [Errno 98] Address already in use")
    api = "(APIServer pid=1) OSError: [Errno 98] Address already in use"
    bind = traceback("", ["run_server"], "OSError: [Errno 98] Address already in use")
    bind[-2] = '    temp_socket.bind(("", args.port))'
    uvicorn = "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use"
    for lines, phase in (([connector], "unknown"), (probe, "unknown"), ([api], "api_listen"), (bind, "api_listen")):
        error = analyze_text("\n".join(lines)).first_error
        assert error is not None and (error.phase, error.category) == (phase, "port_in_use"), lines
    error = analyze_text(uvicorn).first_error
    assert error is not None and (error.phase, error.category) == ("api_listen", "port_in_use")


def test_a_build_failing_while_the_engine_starts_is_placed_by_the_log_not_its_class() -> None:
    # A kernel build runs while the engine profiles, warms up or captures, and at a request's first use: the engine
    # core being built says the engine was starting, not which step built the kernel.
    ninja = (
        "subprocess.CalledProcessError: Command '['ninja', '-v', '-C', '/root/.cache/flashinfer/cached_ops']' "
        "returned non-zero exit status 1."
    )
    chain = [f"{CORE_ERR}", f"{CORE_ERR}The above exception was the direct cause of the following exception:", CORE_ERR]
    for frames, phase in (
        (["run_engine_core", "__init__"], "unknown"),
        (["run_engine_core", "profile_run"], "engine_init"),
    ):
        outer = traceback(CORE_ERR, frames, "RuntimeError: Engine core initialization failed.")
        error = analyze_text("\n".join([f"{CORE_ERR}{ninja}", *chain, *outer])).first_error
        assert error is not None and (error.phase, error.category) == (phase, "compile"), frames


def test_interleaved_cut_tracebacks_are_ordered_by_where_they_began(tmp_path: Path) -> None:
    # Two ranks' tracebacks interleaved and both cut by the excerpt: the one that began first is the earlier error,
    # named by its last frame, whichever traceback shows fewer lines after it.
    zero = "(Worker_TP0_EP0 pid=533) ERROR 06-12 08:47:03 [multiproc_executor.py:962] "
    seven = "(Worker_TP7_EP7 pid=974) ERROR 06-12 08:47:03 [multiproc_executor.py:962] "
    capture = f'{zero}  File "/vllm/v1/worker/gpu_model_runner.py", line 6163, in _warmup_and_capture'
    lines = [
        f'{zero}  File "/vllm/v1/worker/gpu_model_runner.py", line 6217, in _capture_cudagraphs',
        f'{seven}  File "/torch/utils/_contextlib.py", line 124, in decorate_context',
        f"{zero}    self._warmup_and_capture(",
        f"{seven}    return func(*args, **kwargs)",
        capture,
        f"{zero}    self._dummy_run(",
    ]
    path = tmp_path / "interleaved.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for error in (analyze_text("\n".join(lines)).first_error, analyze_path(path).first_error):
        assert error is not None and (error.line, error.category) == (capture, "cudagraph")


def test_a_shutdown_s_cancelled_task_gives_way_to_the_wrapper_naming_the_failure() -> None:
    # uvicorn's lifespan task cancelled as the server gives up comes first in the log; the deploying project's logger
    # then says what failed (KServe's `Failed to start model server: Engine core initialization failed`).
    cancelled = [
        "Traceback (most recent call last):",
        '  File "/venv/lib/python3.12/site-packages/uvicorn/lifespan/on.py", line 137, in receive',
        "    return await self.receive_queue.get()",
        "asyncio.exceptions.CancelledError",
    ]
    failed = (
        "2026-02-11 02:15:04.629 1 kserve ERROR [__main__.py:<module>():337] Failed to start model server: "
        "Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    )
    error = analyze_text("\n".join([*cancelled, "", failed])).first_error
    assert error is not None and error.line == failed
    alone = analyze_text("\n".join(cancelled)).first_error
    assert alone is not None and alone.line == cancelled[-1]


@pytest.mark.parametrize("before", ["", "Loading safetensors checkpoint shards:   0% 0/1 [00:00<?, ?it/s]"])
def test_an_empty_error_record_heads_the_unlogged_traceback_after_it(before: str) -> None:
    # V0's `logger.exception` logs its header with no message, then the traceback without headers; a progress bar
    # may hold the header (written after its rate field without a line end). A cut traceback is named by the header.
    head = f"{before}ERROR 09-24 02:53:53 [engine.py:467] "
    frames = [
        "Traceback (most recent call last):",
        '  File "/vllm/engine/multiprocessing/engine.py", line 455, in run_mp_engine',
        "    engine = MQLLMEngine.from_vllm_config(",
        '  File "/vllm/engine/multiprocessing/engine.py", line 88, in __init__',
        "    self.engine = LLMEngine(*args, **kwargs)",
    ]
    error = analyze_text(
        "\n".join(["INFO 09-24 02:53:51 [weight_utils.py:349] No index found.", head, *frames])
    ).first_error
    assert error is not None and error.line == head


@pytest.mark.parametrize(
    ("prefix", "head", "frames"),
    [
        # the engine core's busy loop running a client's call (a trainer's collective_rpc): the engine is up
        (CORE_ERR, ["Invocation of collective_rpc method failed"], ["_handle_client_request", "collective_rpc"]),
        # NeMo RL syncing its weights into the running engine
        ("(VllmAsyncGenerationWorker pid=7, ip=10.0.0.8) ", [], ["update_weights_via_ipc_zmq_async", "collective_rpc"]),
    ],
)
def test_a_client_s_call_into_the_running_engine_places_serving(
    prefix: str, head: list[str], frames: list[str]
) -> None:
    # (the traceback cut before its exception, as the excerpts are)
    cut = traceback(prefix, frames, "")[:-1]
    error = analyze_text("\n".join([*(prefix + line for line in head), *cut])).first_error
    assert error is not None and (error.phase, error.category) == ("request", "request_error")


@pytest.mark.parametrize(
    ("frames", "exception", "phase"),
    [
        # the graph capture's own steps run only as the engine starts
        (
            ["_capture_cudagraphs", "_warmup_and_capture"],
            "RuntimeError: CUDA error: operation not permitted",
            "engine_init",
        ),
        # the loader processing the weights it loaded: a quantization method repacking them for its kernel
        (["gptq_marlin_repack", "__call__"], "RuntimeError: CUDA driver error: out of memory", "weight_load"),
        (
            ["process_weights_after_loading", "awq_marlin_repack"],
            "RuntimeError: CUDA driver error: out of memory",
            "weight_load",
        ),
    ],
)
def test_a_start_up_step_s_own_frames_place_an_excerpt_that_starts_inside_it(
    frames: list[str], exception: str, phase: str
) -> None:
    # (an excerpt with no marker: the traceback's outer frames, run_engine_core and the model runner's, are cut)
    error = analyze_text("\n".join(traceback(CORE_ERR, frames, exception)[1:])).first_error
    assert error is not None and error.phase == phase


def test_a_message_quoting_a_process_id_is_not_read_from_it() -> None:
    # Only a traceback's line behind a wrapper no rule strips is read from its process prefix on; a message that
    # quotes a `(pid=N)` keeps its words.
    parser = LineParser(default_rules().line)
    line = parser.parse("ERROR 07-01 09:41:21 [core.py:936] Killing worker (pid=123) because it hung")
    assert line.msg == "Killing worker (pid=123) because it hung"
    frame = parser.parse('19.12.25 02:07:16 host bash[22]: (EngineCore_DP0 pid=22)   File "/vllm/x.py", line 1, in f')
    assert (frame.proc, frame.msg) == ("(EngineCore_DP0 pid=22)", '  File "/vllm/x.py", line 1, in f')
