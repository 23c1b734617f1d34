from __future__ import annotations

import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.remote import Producer  # type: ignore[import-untyped]
from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

from kernel.tls import DevCerts, write_dev_certs
from tests.dockerd import Dockerd, running_dockerd
from tests.real_vllm_method import real_run
from tests.slack_api import SlackApi
from tests.vllm_cpu import vllm_caches, vllm_env, vllm_models

# Fixtures defined once here for every module: a session fixture imported by several modules is one per module.
__all__ = ["real_run", "vllm_caches", "vllm_env", "vllm_models"]


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return write_dev_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def other_certs(tmp_path: Path) -> DevCerts:
    """Certificates from a different CA than `certs`."""
    return write_dev_certs(tmp_path / "other-ca")


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    """One private Docker engine (and its locally built vLLM-like images) for the whole session."""
    with running_dockerd() as engine:
        yield engine


@pytest.fixture
def docker_env(dockerd: Dockerd, monkeypatch: pytest.MonkeyPatch) -> Dockerd:
    """The test's process talks to the private engine, as the runner would through $DOCKER_HOST."""
    monkeypatch.setenv("DOCKER_HOST", dockerd.url)
    return dockerd


@pytest.fixture
async def api() -> AsyncIterator[SlackApi]:
    """A local Slack Web API server on port 0 that records every call (tests/slack_api.py)."""
    server = await SlackApi().start()
    yield server
    await server.stop()


# --- Test tiers (`make check` runs the unit tier; `make test` runs them all) ---------------------------------------
# Every test gets exactly one tier marker here, from its module's row in TIERS, overridden by the fixtures it uses
# (a test that uses a real vLLM, dockerd or Slurm fixture is in that tier whatever its module says) or by a tier
# marker written on the test itself. tests/test_tiers.py fails while any test has none: a new module needs a row.
#   unit       no daemon, no server, no subprocess, no network: pure functions, parsers, renderers, stores
#   sim        the simulator end to end: runner daemons, vllm-sim subprocesses, the bot core over loopback gRPC,
#              the local Slack API server, the CLIs run as subprocesses
#   daemons    a system service the tests start: a private dockerd, a single-node Slurm
#   real_vllm  vLLM's own CPU build
TIER_NAMES = ("unit", "sim", "daemons", "real_vllm")
TIERS: dict[str, str] = {
    "test_analyzer_cli": "unit",
    "test_analyzer_corpus": "unit",
    "test_analyzer_excerpts": "unit",
    "test_analyzer_fuzz": "unit",
    "test_analyzer_inference": "unit",
    "test_analyzer_progress": "unit",
    "test_analyzer_properties": "unit",
    "test_analyzer_redos": "unit",
    "test_analyzer_rules": "unit",
    "test_analyzer_scan": "unit",
    "test_analyzer_speed": "unit",
    "test_analyzer_stream": "unit",
    "test_analyzer_support": "unit",  # helpers, no tests
    "test_analyzer_traps": "unit",
    "test_baseline": "unit",
    "test_bot_core": "sim",
    "test_bundle": "unit",
    "test_cache_control": "sim",
    "test_caches": "unit",
    "test_cli_terminal": "sim",
    "test_clock": "unit",
    "test_config": "unit",
    "test_data_files": "unit",
    "test_config_strict": "unit",
    "test_dispatch_isolated": "sim",
    "test_docker_engine": "daemons",
    "test_documented_commands": "unit",
    "test_engine_output": "sim",
    "test_engine_output_docker": "daemons",
    "test_fingerprint": "unit",
    "test_fingerprint_docker": "daemons",
    "test_handoff_report": "sim",
    "test_images": "unit",
    "test_k8s": "sim",
    "test_kube_engine": "sim",
    "test_load_verdicts": "sim",
    "test_log_follower": "sim",
    "test_method": "sim",
    "test_metrics": "sim",
    "test_migrations": "unit",
    "test_one_clock": "unit",
    "test_minimize": "sim",
    "test_products": "unit",
    "test_ports": "sim",
    "test_processes": "sim",
    "test_operations": "unit",
    "test_protos": "unit",
    "test_real_vllm": "real_vllm",
    "test_real_vllm_stacks": "real_vllm",
    "test_real_vllm_caches": "real_vllm",
    "test_real_vllm_healthy": "real_vllm",
    "test_real_vllm_kv_cache": "real_vllm",
    "test_record": "unit",
    "test_redact": "unit",
    "test_redact_redos": "unit",
    "test_render": "unit",
    "test_rerun": "sim",
    "test_rerun_slack": "sim",
    "test_runner_grpc": "sim",
    "test_scenarios": "sim",
    "test_security_bundles": "unit",
    "test_security_faults": "sim",
    "test_security_inputs": "sim",
    "test_security_limits": "unit",
    "test_security_replay": "sim",
    "test_security_secrets": "sim",
    "test_sim_follows_real": "real_vllm",
    "test_sim_secret_args": "real_vllm",
    "test_slack_ack_path": "sim",
    "test_slack_crash": "sim",
    "test_slack_exactly_once": "sim",
    "test_slack_injection": "unit",
    "test_slack_outbox": "sim",
    "test_slack_render": "unit",
    "test_slack_socket_mode": "sim",
    "test_slack_startup": "sim",
    "test_slack_thread": "sim",
    "test_stacks": "unit",
    "test_stacks_sim": "sim",
    "test_stacks_docker": "daemons",
    "test_slurm": "daemons",
    "test_slurm_env": "daemons",
    "test_state_files": "unit",
    "test_store": "unit",
    "test_tiers": "unit",
    "test_timeline": "sim",
    "test_verdict": "unit",
    "test_vllm_cli": "unit",
    "test_vllm_sim": "sim",
}
# Per-test exceptions in a module that mixes tiers and whose tests don't show it by fixture: "module::test" (a
# parametrized test's every case). A unit-tier test that binds or connects a socket or starts a subprocess fails
# (unit_tier_starts_nothing below): it belongs here as "sim".
TIER_OVERRIDES: dict[str, str] = {
    "test_sim_secret_args::test_the_list_form_older_vllm_prints_is_redacted": "unit",
    "test_slurm_env::test_the_allowlist_keeps_the_basics_and_drops_the_rest": "unit",
    # modules of the unit tier whose few tests start a runner, a server or a subprocess
    "test_documented_commands::test_the_slurm_script_starts_its_runner": "sim",
    "test_config_strict::test_the_console_scripts_refuse_an_empty_config_in_one_line": "sim",
    "test_config_strict::test_the_runner_script_refuses_an_open_listener_in_one_line": "sim",
    "test_config_strict::test_a_runner_without_mtls_warns_at_start": "sim",
    "test_config_strict::test_a_refused_tls_file_creates_no_state_dir": "sim",
    "test_baseline::test_an_incompatible_host_stops_the_run_at_baseline": "sim",
    "test_baseline::test_warnings_let_the_run_go_on": "sim",
    "test_slack_injection::test_the_runner_refuses_such_an_image_before_its_allowlist": "sim",
    "test_slack_injection::test_engine_text_reaches_slack_escaped_and_the_terminal_as_it_was": "sim",
    "test_security_limits::test_an_unsigned_deeply_nested_slack_post_is_a_401_before_any_parsing": "sim",
    "test_security_limits::test_status_and_runs_show_only_this_channels_clusters_to_their_operators": "sim",
    "test_fingerprint::test_probe_reads_what_a_python_would_load_without_importing_torch": "sim",
    "test_fingerprint::test_compat_libraries_on_the_loader_path_are_seen": "sim",
    "test_fingerprint::test_a_path_that_is_not_a_python_gives_a_reason": "sim",
    "test_fingerprint::test_secrets_never_reach_the_fingerprint": "sim",
    "test_fingerprint::test_cli_fingerprint_check_and_diff": "sim",
}
# Fixtures that start a tier's system: a test using one (directly or through another fixture) is in that tier.
TIER_FIXTURES: dict[str, str] = {
    "vllm_models": "real_vllm",
    "vllm_env": "real_vllm",
    "dockerd": "daemons",
    "docker_env": "daemons",
    "slurm": "daemons",  # tests/test_slurm.py, tests/test_slurm_env.py: a running single-node Slurm
}


def tier_of(item: pytest.Item) -> str | None:
    written = [m.name for m in item.iter_markers() if m.name in TIER_NAMES]
    if written:
        return written[0]
    fixtures = set(getattr(item, "fixturenames", ()))
    for tier in ("real_vllm", "daemons"):
        if any(TIER_FIXTURES[f] == tier for f in fixtures & TIER_FIXTURES.keys()):
            return tier
    module = item.path.stem
    name = getattr(item, "originalname", item.name)
    return TIER_OVERRIDES.get(f"{module}::{name}", TIERS.get(module))


UNTIERED = pytest.StashKey[list[str]]()  # this session's tests with no tier or more than one, before any -m
# `make test`'s second pass runs these tiers on three workers with `--dist loadgroup`, each worker one serial stream
# (TierGroups). A vLLM CPU launch is three Python processes that import torch and vLLM one after the other, one core
# each, and a launch waits too (a stall limit, an error's moment, a stop's grace): three streams on the two cores
# fill the waits that two left idle. STREAMS gives each real-vLLM module its stream, about a third of the tier's time
# each; the daemons tier (one private dockerd and one Slurm at a time, as in a serial run) and the modules not named
# run in the third. Never more than three vLLM servers at once. The scheduler sees node ids only, so a test of these
# tiers must be in a module whose TIERS row is its tier (tests/test_tiers.py).
SERIAL_TIERS = ("daemons", "real_vllm")
STREAMS = {
    "test_real_vllm_kv_cache": "kv-cache stream",
    "test_real_vllm_caches": "kv-cache stream",
    "test_sim_secret_args": "kv-cache stream",
    "test_real_vllm": "method stream",
    "test_real_vllm_stacks": "method stream",
}
ELSEWHERE = pytest.StashKey[list[str]]()  # this session's tests of a serial tier in a module of another row


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered = config.stash.setdefault(UNTIERED, [])
    elsewhere = config.stash.setdefault(ELSEWHERE, [])
    for item in items:
        tier = tier_of(item)
        if tier is not None and not any(m.name == tier for m in item.iter_markers()):
            item.add_marker(getattr(pytest.mark, tier))
        tiers = {m.name for m in item.iter_markers() if m.name in TIER_NAMES}
        if len(tiers) != 1:
            untiered.append(item.nodeid)
        elif (only := tiers.pop()) in SERIAL_TIERS and TIERS.get(item.path.stem) != only:
            elsewhere.append(item.nodeid)


class TierGroups(LoadGroupScheduling):  # type: ignore[misc]
    """`--dist loadgroup` with the serial tiers in two groups, one per worker. xdist 3.8 groups `xdist_group` marks
    by renaming node ids, which pytest 9 no longer lets a plugin do (the marks reach no scheduler): the group is read
    from the id."""

    def _split_scope(self, nodeid: str) -> str:
        module = Path(nodeid.split("::", 1)[0]).stem
        if TIERS.get(module) not in SERIAL_TIERS:
            return super()._split_scope(nodeid)
        return STREAMS.get(module, "daemons stream")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadGroupScheduling | None:
    return TierGroups(config, log) if config.getvalue("dist") == "loadgroup" else None


@pytest.fixture(autouse=True)
def unit_tier_starts_nothing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tier stays fast by construction: a test in it that binds or connects a socket or starts a
    subprocess fails, saying where to give it another tier."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*_: Any, **__: Any) -> Any:
            raise AssertionError(
                f"a unit-tier test {what}: give {request.node.nodeid} the tier sim (or daemons, real_vllm) in "
                "tests/conftest.py (TIERS, TIER_OVERRIDES)"
            )

        return refused

    monkeypatch.setattr(socket.socket, "bind", refuse("binds a socket"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connects a socket"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connects a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("starts a subprocess"))
