from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import load_bot_config
from runner.config import load_runner_config
from runner.toml_reader import ConfigError


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
    assert config.engine.sim_scenario.endswith("runner/sim/data/scenarios/demo.toml")  # a built-in, by name
    assert config.labels == ("isolated",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('cluster = "a"\nallowed_images = ["x"]\n', "missing key 'name'"),
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


def test_the_shipped_example_configs_are_valid() -> None:
    from runner.vllm_cli import parse_launch_command

    root = Path(__file__).resolve().parent.parent / "deploy" / "config"
    runner = load_runner_config(root / "runner.toml")
    assert runner.tls is not None and runner.engine.backend == "process"
    bot = load_bot_config(root / "k3repro.toml")
    for cluster in bot.clusters.values():
        assert parse_launch_command(list(cluster.launch_argv)).model == "moonshotai/Kimi-K3"
