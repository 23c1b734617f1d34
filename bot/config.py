"""The bot's config (k3repro.toml): clusters and their runners, what a run launches, the store, TLS."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.retention import RETENTION_KEYS, Retention, read_retention
from kernel.tls import pem_problem
from kernel.toml_reader import ConfigError, TomlReader, read_toml, strict
from protos.vocab import DEFAULT_API, DEFAULT_REPEATS

DEFAULT_CONFIG = "k3repro.toml"
CONFIG_ENV = "K3REPRO_CONFIG"

_ISOLATION_KEYS = (
    "provider",
    "queue_wait_s",
    "poll_s",
    "label",
    "partition",
    "nodelist",
    "reservation",
    "account",
    "time_limit",
    "constraint",
    "script",
    "runner_config",
    "work_dir",
    "runner_command",
    "api_url",
    "token_file",
    "ca_file",
    "namespace",
    "job_template",
    "image",
    "runner_port",
    "node_selector",
    "tolerations",
    "tls_secret",
    "config_map",
)
# Every key k3repro.toml may hold, by table ("" is the top level; NAME stands for a cluster's name): a key not
# listed is refused at load with the closest known one. docs/configuration.md documents exactly these
# (tests/test_config_strict.py checks both it and that the parser below reads no other key).
BOT_KEYS: dict[str, tuple[str, ...]] = {
    "": ("store", *RETENTION_KEYS, "connect_timeout_s", "reconnect_for_s", "tls", "slack", "isolation", "clusters"),
    "tls": ("ca", "cert", "key", "server_name"),
    "slack": (
        "bot_token",
        "signing_secret",
        "app_token",
        "api_url",
        "listen",
        "command",
        "post_interval_s",
        "update_interval_s",
        "timeout_s",
    ),
    "isolation": _ISOLATION_KEYS,
    "clusters.NAME": ("runners", "image", "launch", "profile", "request", "channels", "operators", "isolation"),
    "clusters.NAME.request": ("api", "repeats", "body"),
    "clusters.NAME.isolation": _ISOLATION_KEYS,
}


@dataclass(frozen=True)
class ClientTls:
    ca: Path
    cert: Path | None = None
    key: Path | None = None
    server_name: str = ""  # overrides the name checked in runner certificates


@dataclass(frozen=True)
class FixedRequestConfig:
    api: str = DEFAULT_API
    body_json: str = ""  # "": the runner's own fixed request
    repeats: int = DEFAULT_REPEATS


PROVIDERS = ("static", "slurm", "kubernetes")


@dataclass(frozen=True)
class IsolationConfig:
    """Where an isolated rerun runs: `static` (runners labelled `label`), `slurm` (a batch job per rerun) or
    `kubernetes` (a Job per rerun). Paths are taken from the config file's folder."""

    provider: str
    queue_wait_s: float = 600.0  # a job that has not started by then is reported and cancelled
    poll_s: float = 1.0
    label: str = "isolated"  # static
    partition: str = ""  # slurm: sbatch --partition/--nodelist/--reservation/--account/--time/--constraint
    nodelist: str = ""
    reservation: str = ""
    account: str = ""
    time_limit: str = "02:00:00"
    constraint: str = ""
    script: Path | None = None  # slurm: deploy/slurm/k3repro-isolated.sbatch
    runner_config: Path | None = None  # slurm: runner.toml of the isolated runner, on a shared file system
    work_dir: Path | None = None  # slurm: shared folder for the job's port file and output
    runner_command: str = ""  # slurm: k3repro-runner as the job finds it (default: next to this Python)
    api_url: str = ""  # kubernetes: the API server, e.g. https://kubernetes.default.svc
    token_file: Path | None = None
    ca_file: Path | None = None
    namespace: str = "k3repro"
    job_template: Path | None = None  # kubernetes: deploy/k8s/isolated-runner-job.yaml
    image: str = ""  # kubernetes: the runner's image
    runner_port: int = 50051
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[tuple[tuple[str, str], ...], ...] = ()  # each {key, operator, value, effect}
    tls_secret: str = "k3repro-runner-tls"  # noqa: S105 (the name of a Kubernetes Secret, not a secret)
    config_map: str = "k3repro-isolated-runner"


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    runners: tuple[str, ...]
    image: str
    launch_argv: tuple[str, ...]
    profile: str = ""
    request: FixedRequestConfig = FixedRequestConfig()
    channels: tuple[str, ...] = ()  # Slack channel ids where runs may be started; none: nowhere
    operators: tuple[str, ...] = ()  # Slack user ids (U…/W…) and user-group ids (S…) who may start, cancel, rerun
    isolation: IsolationConfig | None = None  # [clusters.X.isolation], else the global [isolation]


@dataclass(frozen=True)
class SlackConfig:
    """The Slack app's credentials and pacing; secrets may come from the environment instead of the file."""

    bot_token: str
    signing_secret: str
    app_token: str = ""  # xapp-…: Socket Mode instead of HTTP
    api_url: str = "https://slack.com/api/"
    listen: str = "0.0.0.0:3000"  # HTTP: Slack's request URL, /healthz and /metrics
    command: str = "/k3repro"
    post_interval_s: float = 1.0  # chat.postMessage per channel (Slack: about 1 per second)
    update_interval_s: float = 1.2  # chat.update, workspace-wide (Tier 3: about 50 per minute)
    timeout_s: float = 10.0  # one Web API call; a time-out is retried by the outbox


@dataclass(frozen=True)
class BotConfig:
    store: Path
    clusters: dict[str, ClusterConfig]
    tls: ClientTls | None = None
    connect_timeout_s: float = 5.0
    reconnect_for_s: float = 600.0  # how long a lost runner stream is retried before the run is marked lost
    slack: SlackConfig | None = None
    retention: Retention = field(
        default_factory=Retention
    )  # log caps per run, days a finished run is kept (the store's)

    def cluster(self, name: str) -> ClusterConfig:
        try:
            return self.clusters[name]
        except KeyError:
            known = ", ".join(sorted(self.clusters)) or "none configured"
            raise ConfigError(f"unknown cluster {name!r} (known: {known})") from None


def config_path(given: Path | None) -> Path:
    return given or Path(os.environ.get(CONFIG_ENV, DEFAULT_CONFIG))


def load_bot_config(path: Path) -> BotConfig:
    """The config file, refused in one line (before anything, the store included, is created) when it is empty
    or defines no cluster."""
    data = read_toml(path)
    if not data:
        raise ConfigError(f"{path}: the file is empty; start from deploy/config/k3repro.toml (docs/configuration.md)")
    config = parse_bot_config(data, base=path.parent, origin=str(path))
    if not config.clusters:
        raise ConfigError(f"{path}: no cluster is defined; add a [clusters.NAME] table (runners, image, launch)")
    return config


def parse_bot_config(data: dict[str, Any], *, base: Path, origin: str) -> BotConfig:
    """Builds the config; relative paths are taken from `base`. Unknown keys are refused first, in every table,
    before any value is read."""
    reader = strict(data, BOT_KEYS[""], origin)
    tls_reader = strict(reader.table("tls"), BOT_KEYS["tls"], origin, "tls")
    slack_reader = strict(reader.table("slack"), BOT_KEYS["slack"], origin, "slack")
    isolation_reader = strict(reader.table("isolation"), BOT_KEYS["isolation"], origin, "isolation")
    cluster_readers = {name: _cluster_readers(name, table, origin) for name, table in reader.table("clusters").items()}
    isolation = _isolation(isolation_reader, base) if isolation_reader.data else None
    clusters = {name: _cluster(name, *readers, base, isolation) for name, readers in cluster_readers.items()}
    tls = None
    if tls_reader.data:
        cert, key = tls_reader.text("cert", ""), tls_reader.text("key", "")
        tls = ClientTls(
            ca=base / tls_reader.text("ca"),
            cert=base / cert if cert else None,
            key=base / key if key else None,
            server_name=tls_reader.text("server_name", ""),
        )
    config = BotConfig(
        store=base / reader.text("store", "k3repro.db"),
        clusters=clusters,
        tls=tls,
        connect_timeout_s=reader.number("connect_timeout_s", 5.0),
        reconnect_for_s=reader.number("reconnect_for_s", 600.0),
        slack=_slack(slack_reader) if slack_reader.data or _slack_in_environment() else None,
        retention=read_retention(reader),
    )
    if not config.connect_timeout_s > 0:
        raise ConfigError(f"{origin}: connect_timeout_s must be above 0, got {config.connect_timeout_s!r}")
    if not config.reconnect_for_s >= 0:
        raise ConfigError(f"{origin}: reconnect_for_s must be 0 or more, got {config.reconnect_for_s!r}")
    if config.store.is_dir():
        raise ConfigError(f"{origin}: store {str(config.store)!r} is a directory, not a SQLite file")
    return config


def check_tls(tls: ClientTls | None) -> None:
    """The client's TLS files, readable and PEM, before any connection needs them (a missing file is one
    line, not a traceback from inside gRPC)."""
    if tls is None:
        return
    for name, path in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key)):
        problem = pem_problem(path) if path is not None else None
        if problem is not None:
            raise ConfigError(f"[tls] {name}: {problem}")


SLACK_SECRETS = {
    "bot_token": "SLACK_BOT_TOKEN",
    "signing_secret": "SLACK_SIGNING_SECRET",
    "app_token": "SLACK_APP_TOKEN",
}


def _slack_in_environment() -> bool:
    """Without a [slack] table, the Slack bot runs on its defaults when the environment has both secrets (a
    container's env_file or Secret, as deploy/ ships)."""
    return all(os.environ.get(SLACK_SECRETS[key]) for key in ("bot_token", "signing_secret"))


def _slack(reader: TomlReader) -> SlackConfig:
    secrets = {key: reader.text(key, "") or os.environ.get(env, "") for key, env in SLACK_SECRETS.items()}
    for key in ("bot_token", "signing_secret"):
        if not secrets[key]:
            raise ConfigError(f"{reader.origin}: {key!r} is not set (nor ${SLACK_SECRETS[key]})")
    return SlackConfig(
        **secrets,
        api_url=reader.text("api_url", SlackConfig.api_url),
        listen=reader.text("listen", SlackConfig.listen),
        command=reader.text("command", SlackConfig.command),
        post_interval_s=reader.number("post_interval_s", SlackConfig.post_interval_s),
        update_interval_s=reader.number("update_interval_s", SlackConfig.update_interval_s),
        timeout_s=reader.number("timeout_s", SlackConfig.timeout_s),
    )


def _isolation(reader: TomlReader, base: Path) -> IsolationConfig:
    provider = reader.text("provider")
    if provider not in PROVIDERS:
        raise ConfigError(f"{reader.origin}: provider {provider!r} is not one of {', '.join(PROVIDERS)}")

    def path(key: str) -> Path | None:
        value = reader.text(key, "")
        return base / value if value else None

    selector = reader.table("node_selector")
    tolerations = reader.value("tolerations", [])
    if not isinstance(tolerations, list) or not all(
        isinstance(t, dict) and all(isinstance(v, str) for v in t.values()) for t in tolerations
    ):
        raise ConfigError(f"{reader.origin}: 'tolerations' must be a list of tables of strings")
    defaults = IsolationConfig(provider)
    config = IsolationConfig(
        provider=provider,
        queue_wait_s=reader.number("queue_wait_s", defaults.queue_wait_s),
        poll_s=reader.number("poll_s", defaults.poll_s),
        label=reader.text("label", defaults.label),
        partition=reader.text("partition", ""),
        nodelist=reader.text("nodelist", ""),
        reservation=reader.text("reservation", ""),
        account=reader.text("account", ""),
        time_limit=reader.text("time_limit", defaults.time_limit),
        constraint=reader.text("constraint", ""),
        script=path("script"),
        runner_config=path("runner_config"),
        work_dir=path("work_dir"),
        runner_command=reader.text("runner_command", ""),
        api_url=reader.text("api_url", ""),
        token_file=path("token_file"),
        ca_file=path("ca_file"),
        namespace=reader.text("namespace", defaults.namespace),
        job_template=path("job_template"),
        image=reader.text("image", ""),
        runner_port=int(reader.number("runner_port", defaults.runner_port)),
        node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        tolerations=tuple(tuple(sorted(t.items())) for t in tolerations),
        tls_secret=reader.text("tls_secret", defaults.tls_secret),
        config_map=reader.text("config_map", defaults.config_map),
    )
    needed = {"slurm": ("script", "runner_config", "work_dir"), "kubernetes": ("api_url", "job_template", "image")}
    missing = [key for key in needed.get(provider, ()) if not getattr(config, key)]
    if missing:
        raise ConfigError(f"{reader.origin}: provider {provider} needs {', '.join(missing)}")
    return config


def _cluster_readers(name: str, data: Any, origin: str) -> tuple[TomlReader, TomlReader, TomlReader]:
    """A cluster's table and its [request] and [isolation] tables, each checked for unknown keys."""
    table = f"clusters.{name}"
    reader = strict(data, BOT_KEYS["clusters.NAME"], origin, table)
    request = strict(reader.table("request"), BOT_KEYS["clusters.NAME.request"], origin, f"{table}.request")
    isolation = strict(reader.table("isolation"), BOT_KEYS["clusters.NAME.isolation"], origin, f"{table}.isolation")
    return reader, request, isolation


def _cluster(
    name: str,
    reader: TomlReader,
    request: TomlReader,
    own_isolation: TomlReader,
    base: Path,
    isolation: IsolationConfig | None,
) -> ClusterConfig:
    launch = reader.value("launch")
    if isinstance(launch, str):
        try:
            argv = tuple(shlex.split(launch))
        except ValueError as exc:  # an unbalanced quote
            raise ConfigError(f"{reader.origin}: 'launch' cannot be split into arguments: {exc}") from None
    elif isinstance(launch, list) and all(isinstance(token, str) for token in launch):
        argv = tuple(launch)
    else:
        raise ConfigError(f"{reader.origin}: 'launch' must be the vllm serve command, as a string or a list")
    body = request.value("body", {})
    if isinstance(body, str):
        body_json = body
    elif isinstance(body, dict):
        body_json = json.dumps(body) if body else ""
    else:
        raise ConfigError(f"{request.origin}: 'body' must be a table or a JSON string")
    runners = tuple(reader.texts("runners"))
    if not runners:
        raise ConfigError(f"{reader.origin}: 'runners' lists no runner address")
    return ClusterConfig(
        name=name,
        runners=runners,
        image=reader.text("image"),
        launch_argv=argv,
        profile=reader.text("profile", ""),
        request=FixedRequestConfig(
            api=request.text("api", DEFAULT_API),
            body_json=body_json,
            repeats=int(request.number("repeats", DEFAULT_REPEATS)),
        ),
        channels=tuple(reader.texts("channels")),
        operators=tuple(reader.texts("operators")),
        isolation=_isolation(own_isolation, base) if own_isolation.data else isolation,
    )
