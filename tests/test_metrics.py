"""Prometheus on both sides: vLLM's /metrics read with prometheus_client's parser (ladder evidence), and the
bot's and the runner's own endpoints scraped over HTTP and read back with the same real text parser."""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.coordinator import Coordinator
from bot.store import AsyncStore
from bot.web import serving
from kernel.launches import LaunchFold
from kernel.tls import DevCerts
from kernel.toml_reader import ConfigError
from protos import runner_pb2 as pb
from protos.vocab import to_id
from runner.config import parse_runner_config
from runner.daemon import DaemonStartError, RunnerDaemon
from runner.stages.prometheus import counter_total
from tests.k3fixtures import bot_config, runner_data, running_runner
from tests.slack_api import SlackApi, slack_config

HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")  # kernel/data/ladder.toml's names


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample by name and label set, through prometheus_client's text parser (it raises on a bad line)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, /, **labels: str) -> float:
    return samples[(metric, frozenset(labels.items()))]


async def _scrape(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200 and response.content_type == "text/plain"
        return await response.text()


# --- reading vLLM's /metrics --------------------------------------------------------------------------------


def test_counters_sum_over_label_sets_and_skip_created_samples() -> None:
    text = (
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits.\n"
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 32.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 16.0\n'
        "# HELP vllm:prefix_cache_hits_created Prefix cache hits.\n"
        "# TYPE vllm:prefix_cache_hits_created gauge\n"
        'vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7649e+09\n'
    )
    assert counter_total(text, HITS) == 48.0


def test_a_label_value_with_quotes_braces_and_escapes_does_not_break_the_read() -> None:
    text = (
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{model_name="a \\"quoted\\" } name, with\\\\slash\\n",engine="0"} 7.0\n'
    )
    assert counter_total(text, HITS) == 7.0


def test_an_older_vllm_name_is_read_when_the_newer_is_absent_and_the_newer_wins_when_both_are() -> None:
    old = '# TYPE vllm:gpu_prefix_cache_hits_total counter\nvllm:gpu_prefix_cache_hits_total{model_name="m"} 5\n'
    assert counter_total(old, HITS) == 5.0
    both = old + 'vllm:prefix_cache_hits_total{model_name="m"} 9\n'  # untyped: its sample keeps its name
    assert counter_total(both, HITS) == 9.0


def test_a_counter_that_is_missing_or_a_scrape_that_does_not_parse_is_no_evidence() -> None:
    assert counter_total('vllm:num_requests_running{model_name="m"} 1\n', HITS) is None
    assert counter_total('vllm:prefix_cache_hits_total{model_name="m} 5\n', HITS) is None  # unterminated quote
    assert counter_total("vllm:prefix_cache_hits_total NaN\n", HITS) is None


# --- our own endpoints ------------------------------------------------------------------------------------


async def test_the_bot_endpoint_parses_and_escapes_a_quote_in_a_label(tmp_path: Path, api: SlackApi) -> None:
    config = slack_config(bot_config(None, tmp_path / "k3.db", ["127.0.0.1:9"]), api)
    async with serving(config, port=0) as served:
        base = f"http://127.0.0.1:{served.port}"
        async with aiohttp.ClientSession() as http, http.post(f"{base}/slack/events", data="x") as refused:
            assert refused.status == 401  # unsigned
        method = 'chat.postMessage"} 1\nk3repro_injected 1'  # what a hand-written exposition would break on
        served.bot.metrics.inc("k3repro_slack_writes_total", method=method, outcome="ok")
        samples = _samples(await _scrape(f"{base}/metrics"))
    assert _value(samples, "k3repro_slack_http_requests_total", status="401") == 1.0
    assert _value(samples, "k3repro_slack_writes_total", method=method, outcome="ok") == 1.0
    assert _value(samples, "k3repro_slack_outbox_pending") == 0.0
    assert _value(samples, "k3repro_runs_followed") == 0.0
    assert not any(name == "k3repro_injected" for name, _ in samples)


async def test_the_runner_endpoint_counts_a_run_from_its_events(certs: DevCerts, tmp_path: Path) -> None:
    data = runner_data(certs, tmp_path / "runner", scenario="demo", metrics={"listen": "127.0.0.1:0"})
    events: list[pb.RunEvent] = []

    async def keep(event: pb.RunEvent) -> None:
        events.append(event)

    async with running_runner(data) as daemon:
        url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
        idle = _samples(await _scrape(url))
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        await core.follow(await core.start("cluster-a", "U1"), keep)
        store.close()
        samples = _samples(await _scrape(url))
    assert _value(idle, "k3repro_runner_info", name="gpu-test", cluster="cluster-a", backend="sim") == 1.0
    assert not any(name == "k3repro_runner_launches_total" for name, _ in idle)
    finished = events[-1].run_finished
    assert (finished.decision, finished.launches) == (pb.DECISION_CONTINUE, 2)
    assert _value(samples, "k3repro_runner_runs_total", status="completed", decision="continue") == 1.0
    proxies = sum(len(e.launch_started.proxies) > 0 for e in events if e.WhichOneof("payload") == "launch_started")
    assert _value(samples, "k3repro_runner_launches_total", kind="proxy") == proxies
    assert _value(samples, "k3repro_runner_launches_total", kind="full") == 2.0 - proxies
    alive = sum(span.end - span.start for span in LaunchFold.of(events) if not span.proxy)
    assert _value(samples, "k3repro_runner_engine_alive_seconds_total", kind="full") == pytest.approx(alive)
    assert alive > 0 and _value(samples, "k3repro_runner_gpus") == 8  # the demo's simulated host
    assert _value(samples, "k3repro_runner_engine_gpu_seconds_total", kind="full") == pytest.approx(alive * 8)
    # the demo's minimal launch fails in NCCL set-up, twice (failure_attempts = 2)
    assert _value(samples, "k3repro_runner_first_errors_total", phase="gpu_detect", category="nccl_comm") == 2.0
    started = {e.stage_started.stage for e in events if e.WhichOneof("payload") == "stage_started"}
    stages = [e.stage_finished for e in events if e.WhichOneof("payload") == "stage_finished"]
    stages = [stage for stage in stages if stage.stage in started]  # a skipped stage never started: no duration
    assert len(stages) == 4
    for stage in stages:
        labels = {"stage": to_id(pb.Stage, stage.stage), "status": to_id(pb.StageStatus, stage.status)}
        assert _value(samples, "k3repro_runner_stage_duration_seconds_count", **labels) >= 1.0
    total = sum(v for (name, _), v in samples.items() if name == "k3repro_runner_stage_duration_seconds_count")
    assert total == len(stages)
    assert _value(samples, "k3repro_runner_active_runs") == 0.0
    assert _value(samples, "k3repro_runner_journal_bytes") > _value(idle, "k3repro_runner_journal_bytes") > 0


def test_the_metrics_endpoint_is_off_unless_configured_and_its_address_is_checked(tmp_path: Path) -> None:
    data = runner_data(None, tmp_path / "runner")
    assert parse_runner_config(data, base=tmp_path, origin="r.toml").metrics_listen == ""
    with pytest.raises(ConfigError, match=r"^r.toml: \[metrics\] listen must be HOST:PORT"):
        parse_runner_config({**data, "metrics": {"listen": "9400"}}, base=tmp_path, origin="r.toml")


async def test_a_taken_metrics_port_stops_the_start_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = runner_data(None, tmp_path / "runner", metrics={"listen": f"127.0.0.1:{port}"})
        daemon = RunnerDaemon(parse_runner_config(data, base=tmp_path, origin="r.toml"))
        with pytest.raises(DaemonStartError, match=rf"^cannot listen on 127\.0\.0\.1:{port}: "):
            await daemon.start()
        await daemon.stop("test finished", grace_s=0)


def test_a_first_error_update_is_not_counted_again_and_a_relaunchs_same_error_is(tmp_path: Path) -> None:
    """The wire's FirstError.update says an error restates one counted already (a later OOM made it secondary);
    a relaunch that fails the same way is a new first error, counted."""
    from prometheus_client import generate_latest

    from runner.metrics import RunnerMetrics

    metrics = RunnerMetrics("r", "c", "sim", tmp_path / "journal.db", lambda: 0)
    error = pb.FirstError(phase=pb.PHASE_GPU_DETECT, category=pb.ERROR_CATEGORY_NCCL_COMM, line="x", signature="s")
    update = pb.FirstError()
    update.CopyFrom(error)
    update.secondary_oom, update.update = True, True
    for seq, payload in enumerate((error, update, error), start=1):
        metrics.observe(pb.RunEvent(run_id="r1", seq=seq, first_error=payload))
    samples = _samples(generate_latest(metrics.registry).decode())
    assert _value(samples, "k3repro_runner_first_errors_total", phase="gpu_detect", category="nccl_comm") == 2.0
