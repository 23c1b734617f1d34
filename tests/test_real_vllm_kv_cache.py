"""A KV cache too small for max_model_len on real vLLM (the CPU build): the run met at its ladder step, then the
same run minimized to the one flag that causes it. One run, several readers (six launches saved)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.minimize import start_minimize
from bot.record import RunRecord
from bot.report import run_report
from bot.store import Store
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from tests.k3fixtures import bot_core, ignore_event, run_to_end
from tests.real_vllm_method import IMAGE, REQUEST, first_errors, ladder, launch_line, runner_settings, sources
from tests.vllm_cpu import ENV

pytestmark = pytest.mark.timeout(900)
# 8 KV blocks cannot hold one sequence of the model's 4096 tokens; --max-num-seqs gives minimize a third flag to drop.
KV_CACHE_FLAGS = ("--enforce-eager", "--max-model-len", "4096", "--num-gpu-blocks-override", "8", "--max-num-seqs", "4")


@dataclass(frozen=True)
class FinishedRun:
    """A run several tests read: its events and report, and its folder (the bot's store, the runner's state)."""

    folder: Path
    launch: str
    events: list[pb.RunEvent]
    report: dict[str, Any]

    @property
    def run_id(self) -> str:
        return self.events[0].run_id


@pytest.fixture(scope="module")
def kv_cache_run(
    certs: DevCerts,
    tmp_path_factory: pytest.TempPathFactory,
    vllm_models: dict[str, Path],
    vllm_caches: dict[str, str],
) -> FinishedRun:
    """The KV-cache-too-small deployment run once (six launches): one test reads its findings, another minimizes
    it from the same store."""
    folder = tmp_path_factory.mktemp("kv-cache-run")
    launch = launch_line(vllm_models["llama-4k"], *KV_CACHE_FLAGS)
    settings = runner_settings(folder / "runner", certs)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**ENV, **vllm_caches}.items():
            patch.setenv(key, value)
        events = asyncio.run(run_to_end(certs, folder, settings, image=IMAGE, launch=launch, request=REQUEST))
    return FinishedRun(folder, launch, events, run_report("run", events))


def test_a_kv_cache_too_small_for_max_model_len(kv_cache_run: FinishedRun) -> None:
    events, report = kv_cache_run.events, kv_cache_run.report
    error = report["first_error"]
    assert error is not None and (error["phase"], error["category"]) == ("engine_init", "kv_cache_capacity")
    assert report["trigger_step"] == "max_model_len" and ladder(report)["max_model_len"] == "oom"
    assert report["checklist"]["failure_repeated"]["state"] == "holds"
    # met on dummy weights, confirmed on the real configuration, repeated on dummy weights after the other steps
    launched = sources(events)
    assert launched.index("ladder/max_model_len/proxy") + 1 == launched.index("ladder/max_model_len/confirm")
    assert launched[-1] == "ladder/max_model_len/repeat-2/proxy"
    assert not any(e.artifact.name == "proxy_abandoned" for e in events)
    assert len(first_errors(events)) >= 2 and len({e.signature for e in first_errors(events)}) == 1


async def test_minimize_shrinks_the_kv_cache_failure_to_the_flag_that_causes_it(
    certs: DevCerts, vllm_env: dict[str, str], kv_cache_run: FinishedRun
) -> None:
    """8 KV blocks cannot hold one sequence of the model's 4096 tokens, with or without --max-model-len 4096:
    the 1-minimal failing set is --num-gpu-blocks-override 8 alone, found on dummy weights and confirmed real.
    The run minimized is the shared one, from its own store, by its runner restarted on its state."""
    folder = kv_cache_run.folder
    settings = runner_settings(folder / "runner", certs)
    async with bot_core(certs, folder, settings, image=IMAGE, launch=kv_cache_run.launch, request=REQUEST) as core:
        started = await start_minimize(core, kv_cache_run.run_id, "U1")
        finished = await core.follow(started, ignore_event)
        events = await core.store.call(Store.events, started.run_id)
    record = RunRecord.replay(started.run_id, events)
    result = json.loads(record.artifacts["minimal_failing_command"])
    assert result["flags"] == ["--num-gpu-blocks-override 8"], result["tests"]
    assert set(result["irrelevant"]) == {  # --enforce-eager is an essential: the minimal launch keeps it
        "--max-model-len 4096",
        "--max-num-seqs 4",
        "--enable-prefix-caching",
    }
    assert (result["failure"]["phase"], result["failure"]["category"]) == ("engine_init", "kv_cache_capacity")
    assert result["confirmed_on_real"] and result["one_minimal"]
    assert finished.launches == result["launches"]
    launched = sources(events)
    assert any(s.startswith("minimize/") and s.endswith("/proxy") for s in launched)  # dummy weights stood in
    assert launched[-1] == "minimize/confirm"  # the last word is a real launch
