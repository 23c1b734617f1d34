"""Where a stalled engine waits, read from py-spy dumps as py-spy prints them: real dumps of a real vLLM CPU engine
stalled in remote code (tests/corpus/stacks/remote-code-sleep/, taken with `py-spy dump --pid` on each of its
processes), and tensor-parallel ranks written in the same format from the frames a real worker showed. The
summary reaches every view of the run: the thread and terminal blocks, the JSON report, the hand-off report."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot import rich
from bot.blocks import first_error_blocks
from bot.handoff import _first_error
from bot.record import RunRecord
from bot.report import report
from kernel.redact import redactor
from kernel.toml_reader import ConfigError, TomlReader
from protos import runner_pb2 as pb
from runner.engines.docker import DockerEngine
from runner.stacks import summary
from runner.stacks.summary import ProcessDump, parse, process_wait, ranges, summarize

CORPUS = Path(__file__).parent / "corpus" / "stacks"
REAL = CORPUS / "remote-code-sleep"


def real_dumps() -> list[ProcessDump]:
    return [ProcessDump(int(p.stem), p.read_text()) for p in sorted(REAL.glob("*.txt"))]


def worker_dump(rank: int, pid: int) -> str:
    """A TP worker's dump: the real worker's (waiting for the engine core's broadcast), titled as rank `rank`."""
    text = (REAL / "31683.txt").read_text()
    return text.replace("Process 31683: VLLM::Worker", f"Process {pid}: VLLM::Worker_TP{rank}")


# A rank that never leaves an all-reduce, as py-spy prints a thread blocked in vLLM's pynccl (frames innermost first)
ALL_REDUCE = """Process {pid}: VLLM::Worker_TP{rank}
Python v3.12.3 (/usr/bin/python3.12)

Thread {pid} (active): "MainThread"
    PyNcclCommunicator.all_reduce (vllm/distributed/device_communicators/pynccl.py:145)
    CudaCommunicator.all_reduce (vllm/distributed/device_communicators/cuda_communicator.py:97)
    GroupCoordinator.all_reduce (vllm/distributed/parallel_state.py:508)
    tensor_model_parallel_all_reduce (vllm/distributed/communication_op.py:14)
    RowParallelLinear.forward (vllm/model_executor/layers/linear.py:1470)
    GPUModelRunner._dummy_run (vllm/v1/worker/gpu_model_runner.py:3520)
    Worker.determine_available_memory (vllm/v1/worker/gpu_worker.py:270)
    WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:1041)
Thread {tid} (idle): "DeathPipeMonitor"
    Connection._recv (multiprocessing/connection.py:395)
    _ConnectionBase.recv (multiprocessing/connection.py:250)
"""


def test_a_real_engine_stalled_in_remote_code_is_named_where_it_sleeps() -> None:
    lines = summarize(real_dumps())
    assert lines[0].startswith("engine core: sleeping in remote code (configuration_k3sleep.py:14)"), lines
    assert lines[1:] == [
        "API server (pid 30603): waits for a message (zmq poll)",
        "resource tracker (pid 31065): idle in main (resource_tracker.py:227)",
        "engine core (pid 31066): sleeping in remote code (configuration_k3sleep.py:14)",
        "worker (pid 31683): waits in shm broadcast (acquire_read, shm_broadcast.py:864)",
    ]


def test_the_broadcast_is_named_rather_than_the_zmq_poll_inside_it() -> None:
    """The real worker's innermost frame is zmq's poll, inside shm_broadcast's acquire_read: the broadcast it is."""
    cmdline, threads = parse((REAL / "31683.txt").read_text())
    assert cmdline == "VLLM::Worker" and [t.name for t in threads] == ["MainThread", "tqdm_monitor", "DeathPipeMonitor"]
    assert threads[0].frames[0].function == "Poller.poll" and threads[0].idle
    wait = process_wait(ProcessDump(31683, (REAL / "31683.txt").read_text())).wait
    assert wait is not None and wait.key == "shm broadcast"


def test_the_rank_that_differs_is_named_with_the_others_grouped() -> None:
    dumps = [ProcessDump(100 + r, worker_dump(r, 100 + r)) for r in range(8) if r != 3]
    dumps.append(ProcessDump(103, ALL_REDUCE.format(pid=103, rank=3, tid=999)))
    lines = summarize(dumps)
    assert lines[0] == (
        "rank 3 differs: waits in all_reduce (pynccl.py:145); "
        "ranks 0-2, 4-7 wait in shm broadcast (acquire_read, shm_broadcast.py:864)"
    )
    assert "rank 3 (pid 103): waits in all_reduce (pynccl.py:145)" in lines


def test_ranks_that_all_wait_alike_are_one_group() -> None:
    dumps = [ProcessDump(10 + r, ALL_REDUCE.format(pid=10 + r, rank=r, tid=90 + r)) for r in range(4)]
    assert summarize(dumps)[0] == "ranks 0-3 wait in all_reduce (pynccl.py:145)"


def test_a_process_that_cannot_be_attached_to_says_why_and_the_others_still_count() -> None:
    dumps = [
        ProcessDump(7, error="Permission denied (os error 13)"),
        ProcessDump(0, error="py-spy is not installed in the image", label="container k3repro-r-1"),
        *real_dumps(),
    ]
    lines = summarize(dumps)
    assert "container k3repro-r-1: cannot attach: py-spy is not installed in the image" in lines
    assert "process (pid 7): cannot attach: Permission denied (os error 13)" in lines
    assert lines[0].startswith("engine core: sleeping in remote code")
    assert summarize([ProcessDump(7, error="No such process")]) == [
        "process (pid 7): cannot attach: No such process",
        "process (pid 7): cannot attach: No such process",
    ]


def test_text_that_is_no_dump_gives_no_frames_not_an_error() -> None:
    assert parse("garbage\n\x00\nThread x") == ("", [])
    assert summarize([ProcessDump(5, "Process 5: python3 x.py\n")]) == [
        "python3: no Python frames",
        "python3 (pid 5): no Python frames",
    ]
    assert ranges([7, 0, 1, 2, 4, 5]) == "0-2, 4-5, 7" and ranges([1, 0, 1, 0]) == "0-1"


def test_the_summary_reaches_the_thread_the_report_and_the_hand_off() -> None:
    stacks = summarize(real_dumps())
    error = pb.FirstError(phase=pb.PHASE_ENGINE_INIT, line="hang: no progress in engine_init for 30 s", stacks=stacks)
    record = RunRecord.replay("r1", [pb.RunEvent(run_id="r1", seq=1, first_error=error)])
    assert record.first_error is not None and record.first_error.stacks == tuple(stacks)
    shown = "\n".join(rich.lines(first_error_blocks(record.first_error)))
    assert f"Where it waits: {stacks[0]}" in shown and "worker (pid 31683)" in shown
    assert report(record)["first_error"]["stacks"] == stacks
    handed = "\n".join(_first_error(record))
    assert "Where it waits (py-spy, before the stop): engine core: sleeping in remote code" in handed


def test_a_secret_flag_after_a_flag_without_value_is_redacted_in_a_dumps_command_line() -> None:
    """py-spy prints each process's command line; a boolean flag before --api-key once took `--api-key` for its
    value and left the key in clear."""
    header = "Process 8428: python3 -m vllm.entrypoints.openai.api_server --trust-remote-code --api-key KeyAfterBool1"
    listed = '["--enforce-eager", "--api-key", "KeyInList2"]'
    redacted = redactor().line(f"{header} {listed}")
    assert "KeyAfterBool1" not in redacted and "KeyInList2" not in redacted
    assert "--trust-remote-code --api-key [REDACTED:" in redacted


class _Container:
    """A container as the docker SDK gives it, whose image has no py-spy (exec_run answers as `sh` would)."""

    name = "k3repro-run-1"

    def exec_run(self, cmd: list[str]) -> tuple[int, bytes]:
        assert cmd[:2] == ["sh", "-c"] and "py-spy" in cmd[2]
        return 1, b""


async def test_a_container_without_py_spy_is_reported_as_such() -> None:
    dumps = await DockerEngine(_Container()).dump_stacks(2.0)
    assert summarize(dumps)[1:] == ["container k3repro-run-1: cannot attach: py-spy is not installed in the image"]
    refused = await DockerEngine(None, "no such image").dump_stacks(2.0)
    assert refused[0].error == "no container was started"


def test_the_real_dumps_planted_api_key_stays_out_of_the_summary_and_is_redacted_in_the_raw_text() -> None:
    """The stored API server dump was taken with `--api-key sk-PLANTEDsecret99` on its command line."""
    raw = (REAL / "30603.txt").read_text()
    assert "sk-PLANTEDsecret99" in raw
    assert not any("PLANTED" in line for line in summarize(real_dumps()))
    assert "PLANTED" not in redactor().line(raw) and "--api-key [REDACTED:" in redactor().line(raw)


def test_workers_not_yet_titled_with_their_rank_are_told_apart_by_pid() -> None:
    """vLLM titles a worker `VLLM::Worker` until its parallel groups exist: a hang in NCCL's set-up comes before."""
    untitled = (REAL / "31683.txt").read_text()
    dumps = [ProcessDump(200 + i, untitled.replace("Process 31683", f"Process {200 + i}")) for i in range(3)]
    hung = ALL_REDUCE.format(pid=203, rank=9, tid=1).replace("VLLM::Worker_TP9", "VLLM::Worker")
    lines = summarize([*dumps, ProcessDump(203, hung)])
    assert lines[0] == (
        "worker pid 203 differs: waits in all_reduce (pynccl.py:145); "
        "worker pids 200, 201, 202 wait in shm broadcast (acquire_read, shm_broadcast.py:864)"
    )


def test_a_bad_row_of_the_data_file_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    data = {"role": [], "wait": [{"id": "collective", "function": "all_reduce(", "says": "waits"}]}
    monkeypatch.setattr(summary, "packaged", lambda name, home: TomlReader(data, f"{home.replace('.', '/')}/{name}"))
    summary._rules.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"^runner/data/stacks.toml \[\[wait\]\] #1 \(collective\): 'function'"):
            summarize(real_dumps())
    finally:
        summary._rules.cache_clear()
