from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import load_bot_config
from kernel.toml_reader import ConfigError
from runner.config import load_runner_config


def test_runner_config_resolves_paths_next_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "runner.toml"
    path.write_text(
        'name = "gpu-a1"\ncluster = "cluster-a"\nallowed_images = ["vllm/vllm-openai:*"]\nlabels = ["isolated"]\n'
        '[tls]\ncert = "certs/runner.pem"\nkey = "certs/runner-key.pem"\nclient_ca = "certs/ca.pem"\n'
        '[engine]\nbackend = "sim"\n[engine.sim]\nscenario = "demo"\nspeed = 10\n'
    )
    config = load_runner_config(path)
    assert config.tls is not None and config.tls.client_ca == tmp_path / "certs/ca.pem"
    assert config.journal_path == tmp_path / "state" / "journal.sqlite"
    assert (config.engine.backend, config.engine.sim_speed) == ("sim", 10.0)
    assert config.engine.sim_scenario.endswith("vllm_sim/data/scenarios/demo.toml")  # a built-in, by name
    assert config.labels == ("isolated",)


def sim(top: str = "", engine: str = "") -> str:
    """A sim runner's config with `top` keys and `[engine]` keys added."""
    return f'name = "r"\ncluster = "a"\nallowed_images = ["x"]\n{top}[engine]\nbackend = "sim"\n{engine}'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name = "r"\nallowed_images = ["x"]\n', "missing key 'cluster'"),
        ('name = "r"\ncluster = "a"\n', "allowed_images is empty"),
        (
            'name = "r"\ncluster = "a"\nallowed_images = ["x"]\n[engine]\nbackend = "k8s"\n',
            "backend 'k8s' is not one of",
        ),
        ('name = "r"\ncluster = "a"\nallowed_images = "x"\n', "'allowed_images' must be a list"),
        ('name = "r"\ncluster = 3\n', "'cluster' must be a string"),
        ("name = \n", "runner.toml"),
        (
            'name = "r"\ncluster = "a"\nallowed_images = ["x"]\n[engine.sim]\nscenario = "nope"\n',
            "no sim scenario 'nope': give a scenario file or one of .*demo.*healthy",
        ),
        (
            'name = "r"\ncluster = "a"\nallowed_images = ["x"]\nrequest_bodies = "maybe"\n',
            'request_bodies must be "text" or "hash", got \'maybe\'',
        ),
        (
            'name = "r"\ncluster = "a"\nallowed_images = ["x"]\n[engine]\nexecutables = ["no-such-vllm-here"]\n',
            "executable 'no-such-vllm-here' is not found",
        ),
        (sim("heartbeat_s = -1\n"), "heartbeat_s must be at least 0.05, got -1"),
        (sim("max_concurrent_runs = 0\n"), "'max_concurrent_runs' must be a whole number of 1 or more, got 0"),
        (sim("max_concurrent_runs = 1.5\n"), "'max_concurrent_runs' must be a whole number"),
        (sim('listen = "garbage"\n'), "listen must be HOST:PORT"),
        (sim('listen = "127.0.0.1:99999"\n'), "listen must be HOST:PORT"),
        (sim('state_dir = "runner.toml"\n'), "state_dir .* is not a directory"),
        (sim(engine="stall_timeout_s = 0\n"), "stall_timeout_s must be above 0"),
        (sim(engine="stop_grace_s = -2\n"), "stop_grace_s must be 0 or more"),
        (sim(engine="failure_attempts = 0\n"), "'failure_attempts' must be a whole number"),
        (sim(engine="[engine.sim]\nspeed = -5\n"), "sim_speed must be above 0"),
        (  # a scenario file next to runner.toml, refused at load for what is wrong in it
            'name = "r"\ncluster = "a"\nallowed_images = ["x"]\n[engine.sim]\nscenario = "broken.toml"\n',
            r"broken.toml: \[deployment\]: missing key 'command'",
        ),
    ],
)
def test_bad_runner_configs_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "runner.toml"
    path.write_text(text)
    (tmp_path / "broken.toml").write_text("[host]\ngpu_count = 8\n")
    with pytest.raises(ConfigError, match=message):
        load_runner_config(path)


def test_bot_config_reads_clusters(tmp_path: Path) -> None:
    path = tmp_path / "k3repro.toml"
    path.write_text(
        '[clusters.cluster-a]\nrunners = ["gpu-a1:50051"]\nimage = "vllm/vllm-openai:kimi-k3"\n'
        'launch = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8"\n'
        '[clusters.cluster-a.request]\napi = "completions"\nbody = {prompt = "hi", max_tokens = 8}\n'
    )
    config = load_bot_config(path)
    cluster = config.cluster("cluster-a")
    assert cluster.launch_argv == ("vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8")
    assert cluster.request.api == "completions" and '"max_tokens": 8' in cluster.request.body_json
    assert config.store == tmp_path / "k3repro.db"
    with pytest.raises(ConfigError, match=r"unknown cluster 'cluster-z' \(known: cluster-a\)"):
        config.cluster("cluster-z")


def test_process_backend_executables_resolve_to_real_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "opt" / "vllm"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vllm").symlink_to(real)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    path = tmp_path / "runner.toml"
    path.write_text('name = "r"\ncluster = "a"\nallowed_images = ["x"]\n[engine]\nexecutables = ["vllm", "opt/vllm"]\n')
    assert load_runner_config(path).engine.executables == (str(real),)  # one real program, named twice


def test_the_shipped_example_configs_are_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel.vllm_cli import parse_launch_command

    (tmp_path / "vllm").write_text("#!/bin/sh\n")  # the shipped runner.toml names `vllm` on PATH
    (tmp_path / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    root = Path(__file__).resolve().parent.parent / "deploy" / "config"
    runner = load_runner_config(root / "runner.toml")
    assert runner.tls is not None and runner.engine.backend == "process"
    assert runner.engine.executables == (str(tmp_path / "vllm"),)
    bot = load_bot_config(root / "k3repro.toml")
    for cluster in bot.clusters.values():
        assert parse_launch_command(list(cluster.launch_argv)).model == "moonshotai/Kimi-K3"
