"""runner.toml: what this runner is, where it listens, and what it may launch."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.retention import RETENTION_KEYS, Retention, read_retention
from kernel.tls import TlsFiles
from kernel.toml_reader import ConfigError, TomlReader, read_toml, strict
from runner.plugins import engine_plugin

BACKENDS = ("docker", "kubernetes", "process", "sim")

# Every key runner.toml may hold, by table ("" is the top level): a key not listed is refused at load with the
# closest known one. docs/configuration.md documents exactly these (tests/test_config_strict.py checks both it
# and that the parser below reads no other key).
RUNNER_KEYS: dict[str, tuple[str, ...]] = {
    "": (
        "name",
        "cluster",
        "labels",
        "listen",
        "insecure",
        "state_dir",
        "max_concurrent_runs",
        "heartbeat_s",
        "allowed_images",
        "baseline_dirs",
        "request_bodies",
        *RETENTION_KEYS,
        "tls",
        "engine",
        "metrics",
    ),
    "tls": ("cert", "key", "client_ca"),
    "engine": (
        "backend",
        "executables",
        "launch_host",
        "ready_timeout_s",
        "stall_timeout_s",
        "request_timeout_s",
        "stop_grace_s",
        "failure_attempts",
        "foreign_memory_wait_s",
        "reuse_server",
        "proxies",
        "sim",
        "docker",
        "kubernetes",
    ),
    "engine.sim": ("scenario", "speed"),
    "engine.docker": ("gpus", "volumes", "env"),
    "engine.kubernetes": (
        "api_url",
        "token_file",
        "ca_file",
        "namespace",
        "node_name",
        "gpus",
        "host_network",
        "start_timeout_s",
        "volumes",
        "env",
    ),
    "metrics": ("listen",),
}


@dataclass(frozen=True)
class DockerSettings:
    """`[engine.docker]`: how the docker backend runs the image (the model cache is usually a volume)."""

    gpus: bool = True  # `--gpus all`, as the deployment runs
    volumes: tuple[str, ...] = ()  # "host:container[:ro]", e.g. the Hugging Face cache
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class KubernetesSettings:
    """`[engine.kubernetes]`: each launch is a Pod on this runner's node, through the API server."""

    api_url: str = "https://kubernetes.default.svc"
    token_file: Path | None = None  # the service account's token (re-read: rotated tokens work)
    ca_file: Path | None = None  # the API server's CA
    namespace: str = "k3repro"
    node_name: str = ""  # "": the NODE_NAME environment variable (the DaemonSet sets it from spec.nodeName)
    gpus: bool = True  # limits nvidia.com/gpu = tensor x pipeline parallel size, from the device plugin
    host_network: bool = False  # false: the Pod's own network, probed at its IP; true: the node's
    start_timeout_s: float = 900.0  # a Pod not running after this long (image pull included) is a failed launch
    volumes: tuple[str, ...] = ()  # "host:container[:ro]" as hostPath volumes, e.g. the Hugging Face cache
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EngineConfig:
    backend: str = "process"
    launch_host: str = "127.0.0.1"
    ready_timeout_s: float = 1800.0
    stall_timeout_s: float = 300.0
    request_timeout_s: float = 120.0
    stop_grace_s: float = 10.0
    failure_attempts: int = 2  # a failure is attempted this many times in all, to show it repeats at one place
    foreign_memory_wait_s: float = 0.0  # before a launch, wait this long for other processes' GPU memory to drain
    # Ladder steps that only change the request reuse the running server; false relaunches for every step
    # (a server that served one probe is not trusted with the next; also the naive plan the bench compares with).
    reuse_server: bool = True
    # Proxy launches (runner/data/proxies.toml) for a failure's repeats and for ladder steps; false: every
    # launch on the real configuration.
    proxies: bool = True
    sim_scenario: str = ""  # sim backend only: a built-in scenario name or a path
    sim_speed: float = 1.0
    docker: DockerSettings = field(default_factory=DockerSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    executables: tuple[str, ...] = ()  # process backend: the only programs it runs, as real paths


@dataclass(frozen=True)
class RunnerConfig:
    name: str
    cluster: str
    listen: str
    state_dir: Path
    labels: tuple[str, ...] = ()
    allowed_images: tuple[str, ...] = ()
    max_concurrent_runs: int = 1
    heartbeat_s: float = 5.0
    baseline_dirs: tuple[Path, ...] = ()  # site baseline profiles (<name>.toml), before the shipped ones
    request_bodies: str = "text"  # how the scene records the fixed request's body: "text" (redacted) or "hash"
    tls: TlsFiles | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    metrics_listen: str = ""  # `[metrics] listen`: HOST:PORT of the Prometheus endpoint; "" serves none
    insecure: bool = False  # serve without mTLS on an address other hosts reach (refused unless set)
    retention: Retention = field(default_factory=Retention)  # log caps per run, days a finished run is kept

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.sqlite"

    @property
    def mutual_tls(self) -> bool:
        """Clients must present a certificate signed by `client_ca`."""
        return self.tls is not None and self.tls.client_ca is not None


def is_loopback(listen: str) -> bool:
    """Whether HOST:PORT listens on this host's loopback only (a host name other than localhost, `0.0.0.0` and
    `[::]` are not: other hosts may reach them)."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_executable(program: str) -> str | None:
    """The real path a program name or path runs (PATH lookup, then symlinks resolved); None if not found.
    The config's executables and each launch's argv[0] are resolved the same way, so they compare."""
    found = shutil.which(program)
    return os.path.realpath(found) if found else None


def load_runner_config(path: Path) -> RunnerConfig:
    data = read_toml(path)
    if not data:
        raise ConfigError(f"{path}: the file is empty; start from deploy/config/runner.toml (docs/configuration.md)")
    return parse_runner_config(data, base=path.parent, origin=str(path))


def parse_runner_config(data: dict[str, Any], *, base: Path, origin: str) -> RunnerConfig:
    """Builds the config; relative paths are taken from the config file's folder. Unknown keys are refused
    first, in every table, before any value is read."""
    tables = _tables(data, origin)
    reader = tables[""]
    tls = _tls(tables["tls"], base)
    engine = _engine(tables, base, origin)
    _check_ranges(engine, f"{origin} [engine]")
    config = RunnerConfig(
        name=reader.text("name", "") or socket.gethostname(),
        cluster=reader.text("cluster"),
        listen=reader.text("listen", "127.0.0.1:50051"),
        state_dir=base / reader.text("state_dir", "state"),
        labels=tuple(reader.texts("labels")),
        allowed_images=tuple(reader.texts("allowed_images")),
        max_concurrent_runs=_whole(reader, "max_concurrent_runs", 1),
        heartbeat_s=reader.number("heartbeat_s", 5.0),
        baseline_dirs=tuple(base / d for d in reader.texts("baseline_dirs")),
        request_bodies=reader.text("request_bodies", "text"),
        tls=tls,
        engine=engine,
        metrics_listen=tables["metrics"].text("listen", ""),
        insecure=reader.flag("insecure", False),
        retention=read_retention(reader),
    )
    if config.request_bodies not in ("text", "hash"):
        raise ConfigError(f'{origin}: request_bodies must be "text" or "hash", got {config.request_bodies!r}')
    if not config.allowed_images:
        raise ConfigError(f"{origin}: allowed_images is empty; list the image patterns this runner may launch")
    _check_runner(config, origin)
    return config


def _tables(data: dict[str, Any], origin: str) -> dict[str, TomlReader]:
    """A reader for each table of RUNNER_KEYS, by its dotted name; each refuses the keys its table may not hold."""
    tables = {"": strict(data, RUNNER_KEYS[""], origin)}
    for name in ("tls", "engine", "engine.sim", "engine.docker", "engine.kubernetes", "metrics"):
        parent, _, key = name.rpartition(".")
        tables[name] = strict(tables[parent].table(key), RUNNER_KEYS[name], origin, name)
    return tables


def _tls(reader: TomlReader, base: Path) -> TlsFiles | None:
    if not reader.data:
        return None
    ca = reader.text("client_ca", "")
    return TlsFiles(cert=base / reader.text("cert"), key=base / reader.text("key"), client_ca=base / ca if ca else None)


def _engine(tables: dict[str, TomlReader], base: Path, origin: str) -> EngineConfig:
    """[engine] and its backends' tables; only the chosen backend's programs and scenario are resolved."""
    reader, sim, docker = tables["engine"], tables["engine.sim"], tables["engine.docker"]
    docker_env = docker.table("env")
    if not all(isinstance(v, str) for v in docker_env.values()):
        raise ConfigError(f"{origin} [engine.docker]: 'env' values must be strings")
    backend = reader.text("backend", "process")
    if backend not in BACKENDS:
        raise ConfigError(f"{origin} [engine]: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    scenario = sim.text("scenario", "")
    if scenario:  # resolved and read now: a broken scenario is refused here, not at every launch
        scenario = engine_plugin("sim").scenario(scenario, base)
    defaults = EngineConfig()
    # Only the process backend runs programs of this host: the others keep the list unresolved (a docker or sim
    # host need not have vllm installed).
    executables = _executables(reader, base) if backend == "process" else ()
    if backend != "process":
        reader.texts("executables")  # still a list of strings
    return EngineConfig(
        backend=backend,
        launch_host=reader.text("launch_host", defaults.launch_host),
        ready_timeout_s=reader.number("ready_timeout_s", defaults.ready_timeout_s),
        stall_timeout_s=reader.number("stall_timeout_s", defaults.stall_timeout_s),
        request_timeout_s=reader.number("request_timeout_s", defaults.request_timeout_s),
        stop_grace_s=reader.number("stop_grace_s", defaults.stop_grace_s),
        failure_attempts=_whole(reader, "failure_attempts", defaults.failure_attempts),
        foreign_memory_wait_s=reader.number("foreign_memory_wait_s", defaults.foreign_memory_wait_s),
        reuse_server=reader.flag("reuse_server", defaults.reuse_server),
        proxies=reader.flag("proxies", defaults.proxies),
        sim_scenario=scenario,
        sim_speed=sim.number("speed", defaults.sim_speed),
        docker=DockerSettings(
            gpus=docker.flag("gpus", True),
            volumes=tuple(docker.texts("volumes")),
            env=tuple(sorted(docker_env.items())),
        ),
        kubernetes=_kubernetes(tables["engine.kubernetes"], base),
        executables=executables,
    )


def _kubernetes(reader: TomlReader, base: Path) -> KubernetesSettings:
    defaults = KubernetesSettings()
    env = reader.table("env")
    if not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{reader.origin}: 'env' values must be strings")

    def path(key: str) -> Path | None:
        value = reader.text(key, "")
        return base / value if value else None

    settings = KubernetesSettings(
        api_url=reader.text("api_url", defaults.api_url),
        token_file=path("token_file"),
        ca_file=path("ca_file"),
        namespace=reader.text("namespace", defaults.namespace),
        node_name=reader.text("node_name", ""),
        gpus=reader.flag("gpus", defaults.gpus),
        host_network=reader.flag("host_network", defaults.host_network),
        start_timeout_s=reader.number("start_timeout_s", defaults.start_timeout_s),
        volumes=tuple(reader.texts("volumes")),
        env=tuple(sorted(env.items())),
    )
    if not settings.start_timeout_s > 0:
        raise ConfigError(f"{reader.origin}: start_timeout_s must be above 0, got {settings.start_timeout_s!r}")
    if not settings.api_url.startswith(("https://", "http://")):
        raise ConfigError(f"{reader.origin}: api_url must be an http(s) URL, got {settings.api_url!r}")
    return settings


def _whole(reader: TomlReader, key: str, default: int) -> int:
    value = reader.number(key, default)
    if value != int(value) or value < 1:
        raise ConfigError(f"{reader.origin}: {key!r} must be a whole number of 1 or more, got {value!r}")
    return int(value)


def _executables(reader: TomlReader, base: Path) -> tuple[str, ...]:
    """`executables`: names looked up on PATH or paths (relative ones from the config's folder), each
    resolved to its real path now, so a later change of PATH or of a symlink cannot widen the list."""
    resolved: list[str] = []
    for entry in reader.texts("executables"):
        program = str(base / entry) if "/" in entry and not entry.startswith("/") else entry
        real = resolve_executable(program)
        if real is None:
            raise ConfigError(f"{reader.origin}: executable {entry!r} is not found (or not executable) on this host")
        resolved.append(real)
    return tuple(dict.fromkeys(resolved))


def _check_ranges(engine: EngineConfig, origin: str) -> None:
    for name in ("ready_timeout_s", "stall_timeout_s", "request_timeout_s", "sim_speed"):
        if not getattr(engine, name) > 0:
            raise ConfigError(f"{origin}: {name} must be above 0, got {getattr(engine, name)!r}")
    for name in ("stop_grace_s", "foreign_memory_wait_s"):
        if not getattr(engine, name) >= 0:
            raise ConfigError(f"{origin}: {name} must be 0 or more, got {getattr(engine, name)!r}")


def _check_address(origin: str, key: str, listen: str) -> None:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{origin}: {key} must be HOST:PORT (port 0-65535), got {listen!r}")


def _check_runner(config: RunnerConfig, origin: str) -> None:
    """Values that parse but cannot work, refused at load with the key that is wrong."""
    if not config.heartbeat_s >= 0.05:
        raise ConfigError(f"{origin}: heartbeat_s must be at least 0.05, got {config.heartbeat_s!r}")
    _check_address(origin, "listen", config.listen)
    if config.metrics_listen:
        _check_address(origin, "[metrics] listen", config.metrics_listen)
    if config.state_dir.exists() and not config.state_dir.is_dir():
        raise ConfigError(f"{origin}: state_dir {str(config.state_dir)!r} is not a directory")
    if not config.mutual_tls and not config.insecure and not is_loopback(config.listen):
        missing = "there is no [tls]" if config.tls is None else "[tls] has no client_ca"
        raise ConfigError(
            f"{origin}: listen {config.listen} is reachable from other hosts and {missing}, so anyone could start "
            "runs; configure mTLS ([tls] cert, key, client_ca) or set insecure = true"
        )
