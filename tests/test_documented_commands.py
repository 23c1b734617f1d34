"""Every command the repository documents runs: the README's (its code blocks, its command table, the commands
its prose quotes), the Dockerfile's ENTRYPOINT and CMD, the compose file's command, every container of the
Kubernetes manifests (the isolated rerun's Job template included), the systemd unit's ExecStart and the Slurm
script's runner. Each goes through the real entry point (pyproject's [project.scripts]); where a daemon would
start (`k3repro-bot serve|resume`, `k3repro-runner serve`) it runs with `--check-config`, on the config files it
names: the repository's samples (deploy/config/, the ConfigMaps of deploy/k8s/config.yaml) with the absolute
paths they name (TLS files, state dir, service account) pointed at temporary stand-ins. The sample runner
configs start on every backend as shipped."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import BOT_KEYS, IsolationConfig, parse_bot_config
from kernel.tls import write_dev_certs
from runner.config import RUNNER_KEYS, parse_runner_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PROGRAMS = ("k3repro", "k3repro-bot", "k3repro-runner")
DAEMONS = {("k3repro-bot", "serve"), ("k3repro-bot", "resume"), ("k3repro-runner", "serve")}
SLACK_ENV = {"SLACK_BOT_TOKEN": "xoxb-documented", "SLACK_SIGNING_SECRET": "documented-secret"}


@dataclass(frozen=True)
class Documented:
    """One documented command: where it is written, its argv, and what backs the files it names."""

    where: str
    argv: tuple[str, ...]
    # a documented path -> ("file", repo path) or ("configmap", name, key): the content a deployment puts there
    files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    mention: bool = False  # quoted in prose: it may leave out required arguments, nothing it says may be wrong

    @property
    def id(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def entry_points() -> dict[str, Callable[[list[str]], int]]:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    found = {}
    for name in PROGRAMS:
        module, _, function = scripts[name].partition(":")
        found[name] = getattr(importlib.import_module(module), function)
    return found


# --- what the repository documents ------------------------------------------------------------------------------


def _synopsis_variants(text: str) -> list[list[str]]:
    """A command as the README writes it (`start CLUSTER [--logs] [--log FILE]`, `[--image REF | --python PATH]`,
    `PATH|-`) as concrete argvs: no option, each option group and each alternative alone, all of them."""
    tokens = shlex.split(text.replace("\\|", "|").replace("[", " [ ").replace("]", " ] "))
    items: list[list[list[str]] | str] = []  # a word, or a group: its alternatives, each a list of words
    group: list[list[str]] | None = None
    for token in tokens:
        if token == "[":
            group = [[]]
        elif token == "]":
            assert group is not None, text
            items.append(group)
            group = None
        elif group is not None and token == "|":
            group.append([])
        elif group is not None:
            group[-1].append(token)
        else:
            items.append(token)

    def build(choice: dict[int, int]) -> list[str]:
        argv: list[str] = []
        for index, item in enumerate(items):
            if isinstance(item, str):
                argv.append(item.split("|")[choice.get(index, 0)] if item != "|" else item)
            elif index in choice:
                argv += [word.split("|")[0] for word in item[choice[index]]]
        return argv

    variants = [build({})]
    for index, item in enumerate(items):
        alternatives = len(item) if isinstance(item, list) else len(item.split("|"))
        variants += [build({index: n}) for n in range(alternatives)]
    variants.append(build({i: 0 for i, item in enumerate(items) if isinstance(item, list)}))
    unique: list[list[str]] = []
    for variant in variants:
        if variant not in unique:
            unique.append(variant)
    return unique


def _starts_a_program(text: str) -> bool:
    return text.split(" ")[0] in PROGRAMS and " " in text


def readme_commands() -> Iterator[Documented]:
    lines = (ROOT / "README.md").read_text().splitlines()
    fence: str | None = None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:]
            continue
        where = f"README.md:{number}"
        if fence is not None:
            if fence in ("", "sh", "console", "bash", "shell"):
                command = stripped.removeprefix("$ ")
                if _starts_a_program(command):
                    yield Documented(where, tuple(shlex.split(command, comments=True)))
            continue
        if stripped.startswith("| `k3repro"):  # the command table: every row's first cell
            cell = re.split(r"(?<!\\)\|", stripped)[1]
            program = ""
            for span in re.findall(r"`([^`]+)`", cell):
                if span.split(" ")[0] in PROGRAMS:
                    program = span.split(" ")[0]
                else:  # `k3repro bundle export RUN -o FILE` / `bundle import FILE`
                    span = f"{program} {span}"
                for variant in _synopsis_variants(span):
                    yield Documented(where, tuple(variant))
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if _starts_a_program(span):
                for variant in _synopsis_variants(span):
                    yield Documented(where, tuple(variant), mention=True)


def _dockerfile_stages() -> dict[str, dict[str, list[str]]]:
    """Each stage's ENTRYPOINT and CMD (exec form), inherited from the stage it is built FROM."""
    stages: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if match := re.match(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE):
            current = dict(stages.get(match.group(1), {}))
            stages[match.group(2) or match.group(1)] = current
        elif match := re.match(r"^(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line):
            current[match.group(1)] = json.loads(match.group(2))
    return stages


def dockerfile_commands() -> Iterator[Documented]:
    config = {"/etc/k3repro/runner.toml": ("file", "deploy/config/runner.toml")}
    config["/etc/k3repro/k3repro.toml"] = ("file", "deploy/config/k3repro.toml")
    for stage, instructions in _dockerfile_stages().items():
        if "ENTRYPOINT" in instructions or "CMD" in instructions:
            argv = instructions.get("ENTRYPOINT", []) + instructions.get("CMD", [])
            yield Documented(f"Dockerfile: {stage}", tuple(argv), config)


def compose_commands() -> Iterator[Documented]:
    path = DEPLOY / "compose" / "compose.yaml"
    stages = _dockerfile_stages()
    for name, service in yaml.safe_load(path.read_text())["services"].items():
        image = stages[service["build"]["target"]]
        entrypoint = service.get("entrypoint", image.get("ENTRYPOINT", []))
        argv = [*entrypoint, *service.get("command", image.get("CMD", []))]
        files = {"/etc/k3repro/k3repro.toml": ("file", "deploy/config/k3repro.toml")}
        yield Documented(f"deploy/compose/compose.yaml: {name}", tuple(argv), files)


def _k8s_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path.name, document


def _placeholder(value: str) -> str:
    """The Job template's `${CONFIG_MAP}`, `${TLS_SECRET}`: the values the bot fills in by default."""
    defaults = {"CONFIG_MAP": IsolationConfig.config_map, "TLS_SECRET": IsolationConfig.tls_secret}
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], value)


def k8s_commands() -> Iterator[Documented]:
    for name, document in _k8s_documents():
        if document["kind"] not in ("Deployment", "DaemonSet", "Job"):
            continue
        pod = document["spec"]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        for container in pod["containers"]:
            files: dict[str, tuple[str, ...]] = {}
            for mount in container.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                if "configMap" in volume:
                    config_map = _placeholder(volume["configMap"]["name"])
                    files[mount["mountPath"]] = ("configmap", config_map, mount.get("subPath", ""))
                elif "secret" in volume:
                    files[mount["mountPath"]] = ("secret", _placeholder(volume["secret"]["secretName"]))
            argv = [*container.get("command", []), *container.get("args", [])]
            kind, title = document["kind"], document["metadata"]["name"]
            yield Documented(f"deploy/k8s/{name}: {kind} {title}/{container['name']}", tuple(argv), files)


def systemd_commands() -> Iterator[Documented]:
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        for line in path.read_text().splitlines():
            if line.startswith("ExecStart="):
                files = {"/etc/k3repro/runner.toml": ("file", "deploy/config/runner.toml")}
                yield Documented(f"deploy/systemd/{path.name}", tuple(shlex.split(line.partition("=")[2])), files)


def documented() -> list[Documented]:
    found = [*readme_commands(), *dockerfile_commands(), *compose_commands(), *k8s_commands(), *systemd_commands()]
    unique: dict[str, Documented] = {}
    for command in found:
        unique.setdefault(command.id, command)
    return list(unique.values())


COMMANDS = documented()


def test_every_kind_of_document_was_found() -> None:
    wheres = {c.where.split(":")[0] for c in COMMANDS}
    assert wheres >= {
        "README.md",
        "Dockerfile",
        "deploy/compose/compose.yaml",
        "deploy/k8s/bot.yaml",
        "deploy/k8s/runner-daemonset.yaml",
        "deploy/k8s/isolated-runner-job.yaml",
        "deploy/systemd/k3repro-runner.service",
    }
    programs = {(c.argv[0].rsplit("/", 1)[-1], c.argv[1]) for c in COMMANDS if len(c.argv) > 1}
    assert programs >= DAEMONS
    assert sum(1 for c in COMMANDS if c.where.startswith("README.md") and not c.mention) >= 20


# --- a site where the documented files exist --------------------------------------------------------------------


class Site:
    """Temporary stand-ins for what a deployment provides: TLS files, /var/lib/k3repro, the service account, a
    `vllm` on PATH, and a working folder holding the samples under the names the README uses."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp
        self.certs = write_dev_certs(tmp / "tls")
        self.account = tmp / "serviceaccount"
        self.account.mkdir()
        (self.account / "token").write_text("token")
        (self.account / "ca.crt").write_text(self.certs.ca.read_text())
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        (bin_dir / "vllm").write_text("#!/bin/sh\n")
        (bin_dir / "vllm").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        for key, value in SLACK_ENV.items():  # compose's env_file, the k3repro-slack Secret
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("K3REPRO_CONFIG", raising=False)
        self.cwd = tmp / "cwd"
        self.cwd.mkdir()
        for name in ("runner.toml", "k3repro.toml"):  # README: `--config runner.toml`, `k3repro.toml`, the default
            self.config(self.cwd / name, (DEPLOY / "config" / name).read_text())
        monkeypatch.chdir(self.cwd)
        self.k8s = {(d["kind"], d["metadata"]["name"]): d for _, d in _k8s_documents()}

    def rewrite(self, text: str, tls: Path | None = None) -> str:
        for documented_path, here in (
            ("/etc/k3repro/tls", tls or self.certs.ca.parent),
            ("/var/lib/k3repro", self.tmp / "var-lib-k3repro"),
            ("/var/run/secrets/kubernetes.io/serviceaccount", self.account),
            ("/opt/k3repro/deploy", DEPLOY),
        ):
            text = text.replace(documented_path, str(here))
        return text

    def config(self, path: Path, text: str, tls: Path | None = None) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.rewrite(text, tls))
        return path

    def secret(self, name: str) -> Path:
        """A Secret's keys as files, taken from the dev certificates of the same names."""
        folder = self.tmp / "secrets" / name
        folder.mkdir(parents=True, exist_ok=True)
        for key in self.k8s[("Secret", name)]["stringData"]:
            source = self.certs.ca.parent / key
            assert source.is_file(), f"Secret {name} holds {key}, which no certificate of the layout is"
            (folder / key).write_text(source.read_text())
        return folder

    def argv(self, command: Documented) -> list[str]:
        """The command with each documented file replaced by its stand-in."""
        secrets = {path: self.secret(spec[1]) for path, spec in command.files.items() if spec[0] == "secret"}
        tls = next(iter(secrets.values()), None)
        here: dict[str, str] = {}
        for documented_path, spec in command.files.items():
            target = self.tmp / "files" / re.sub(r"\W", "_", command.id) / Path(documented_path).name
            if spec[0] == "file":
                here[documented_path] = str(self.config(target, (ROOT / spec[1]).read_text(), tls))
            elif spec[0] == "configmap":
                data = self.k8s[("ConfigMap", spec[1])]["data"]
                assert spec[2] in data, f"ConfigMap {spec[1]} has no {spec[2]!r}"
                here[documented_path] = str(self.config(target, data[spec[2]], tls))
        return [here.get(word, word) for word in command.argv[1:]]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    return Site(tmp_path, monkeypatch)


# --- they run ---------------------------------------------------------------------------------------------------


def _parse_terminal(argv: list[str]) -> None:
    """`k3repro`'s argv through the parser its main uses (`parse`, which builds a command's arguments on demand,
    where it exists)."""
    cli = importlib.import_module("bot.cli")
    if hasattr(cli, "parse"):
        cli.parse(argv)
    else:
        cli.build_parser().parse_args(argv)


def _run(command: Documented, site: Site, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    program = command.argv[0].rsplit("/", 1)[-1]
    assert program in PROGRAMS, command.id
    argv = site.argv(command)
    daemon = (program, argv[0] if argv else "") in DAEMONS
    capsys.readouterr()
    try:
        if daemon:
            code = entry_points()[program]([*argv, "--check-config"])
        else:  # the terminal's commands talk to runners: their argv goes through the real parser
            _parse_terminal(argv)
            code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_the_documented_command_runs(command: Documented, site: Site, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(command, site, capsys)
    if command.mention and code == 2 and "the following arguments are required" in err:
        return  # prose quoting an option (`k3repro start --log FILE`): nothing it says is wrong
    assert code == 0, f"{command.id}\n{err}"
    program = command.argv[0].rsplit("/", 1)[-1]
    if len(command.argv) > 1 and (program, command.argv[1]) in DAEMONS:
        assert ": ok: " in out, out


def test_the_slurm_script_starts_its_runner(site: Site, tmp_path: Path) -> None:
    """deploy/slurm/k3repro-isolated.sbatch run by bash as the job runs it, its runner checking its config."""
    config = site.config(tmp_path / "shared" / "isolated-runner.toml", (DEPLOY / "config" / "runner.toml").read_text())
    wrapper = tmp_path / "k3repro-runner"
    wrapper.write_text(
        f'#!/bin/sh\nexec {shlex.quote(str(Path(sys.executable).parent / "k3repro-runner"))} "$@" --check-config\n'
    )
    wrapper.chmod(0o755)
    result = subprocess.run(
        ["bash", DEPLOY / "slurm" / "k3repro-isolated.sbatch", config, tmp_path / "shared" / "port"],
        env={**os.environ, "K3REPRO_RUNNER": str(wrapper)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"k3repro-runner: {config}: ok: runner gpu-a1, cluster cluster-a"), result.stdout
    assert not (tmp_path / "shared" / "port").exists()  # a check serves nothing


def _uncommented(text: str, table: str) -> str:
    """The sample with its commented `# [TABLE]` example block switched on."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# [{table}]"))
    end = start
    while end < len(lines) and lines[end].startswith("# "):
        lines[end] = lines[end][2:]
        end += 1
    return "\n".join(lines) + "\n"


def _runner_samples() -> Iterator[tuple[str, str]]:
    sample = (DEPLOY / "config" / "runner.toml").read_text()
    shipped = re.search(r'^backend = "(\w+)"', sample, re.MULTILINE)
    assert shipped is not None
    for backend in ("process", "docker", "sim"):
        text = sample.replace(shipped.group(0), f'backend = "{backend}"')
        yield f"deploy/config/runner.toml as {backend}", text
        if backend != "process":
            yield (
                f"deploy/config/runner.toml as {backend} with [engine.{backend}]",
                _uncommented(text, f"engine.{backend}"),
            )
    for _, document in _k8s_documents():
        if document["kind"] == "ConfigMap" and "runner.toml" in document["data"]:
            yield f"deploy/k8s/config.yaml ConfigMap {document['metadata']['name']}", document["data"]["runner.toml"]


RUNNER_SAMPLES = dict(_runner_samples())


@pytest.mark.parametrize("name", list(RUNNER_SAMPLES))
def test_the_sample_runner_configs_start_on_every_backend(
    name: str, site: Site, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = RUNNER_SAMPLES[name]
    backend = tomllib.loads(text)["engine"]["backend"]
    if backend != "process":  # a docker or sim host has no vllm: nothing may ask for one
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    config = site.config(tmp_path / "runner.toml", text)
    runner_main = entry_points()["k3repro-runner"]
    capsys.readouterr()
    assert runner_main(["serve", "--config", str(config), "--check-config"]) == 0, capsys.readouterr().err
    assert f"backend {backend}" in capsys.readouterr().out


def _readme_toml_blocks() -> Iterator[tuple[int, dict[str, Any]]]:
    lines = (ROOT / "README.md").read_text().splitlines()
    block: list[str] | None = None
    start = 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if block is None and stripped == "```toml":
            block, start = [], number
        elif block is not None and stripped == "```":
            yield start, tomllib.loads("\n".join(block))
            block = None
        elif block is not None:
            block.append(line.strip())


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merged(merged[key], value) if isinstance(value, dict) and key in merged else value
    return merged


def test_the_readmes_config_examples_use_only_known_keys(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    bot_sample = tomllib.loads(site.rewrite((DEPLOY / "config" / "k3repro.toml").read_text()))
    runner_sample = tomllib.loads(site.rewrite((DEPLOY / "config" / "runner.toml").read_text()))
    checked = 0
    for line, block in _readme_toml_blocks():
        if set(block) <= set(BOT_KEYS[""]):
            block = json.loads(site.rewrite(json.dumps(block)))
            parse_bot_config(_merged(bot_sample, block), base=site.cwd, origin=f"README.md:{line}")
        elif set(block) <= set(RUNNER_KEYS[""]):
            parse_runner_config(_merged(runner_sample, block), base=site.cwd, origin=f"README.md:{line}")
        else:
            assert "deployment" in block, f"README.md:{line}: a TOML block of neither file nor a scenario"
            continue
        checked += 1
    assert checked >= 2


def test_the_compose_and_kubernetes_bots_get_the_slack_secrets_from_their_environment() -> None:
    """The bot's sample k3repro.toml has no [slack] table: the secrets come from compose's env_file and the
    k3repro-slack Secret, which must name both."""
    example = (DEPLOY / "compose" / "slack.env.example").read_text()
    named = {line.split("=")[0] for line in example.splitlines() if re.match(r"^[A-Z_]+=\S", line)}
    assert set(SLACK_ENV) <= named
    secret = {d["metadata"]["name"]: d for _, d in _k8s_documents() if d["kind"] == "Secret"}["k3repro-slack"]
    assert set(SLACK_ENV) <= set(secret["stringData"])
