"""Strict configs: a key no parser knows is refused with the file, the table, the key and its closest known one;
a refused file creates nothing; docs/configuration.md lists exactly the keys the parsers know and read; a runner
serves without mTLS only on loopback or when told `insecure = true`."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot import cli
from bot import main as bot_main
from bot.config import BOT_KEYS, load_bot_config, parse_bot_config
from kernel import toml_reader
from kernel.tls import DevCerts
from kernel.toml_reader import ConfigError, TomlReader
from runner.config import RUNNER_KEYS, is_loopback, load_runner_config, parse_runner_config
from runner.daemon import RunnerDaemon

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "configuration.md"
RUNNER = 'name = "r"\ncluster = "cluster-a"\nallowed_images = ["vllm/vllm-openai:*"]\n'
CLUSTER = (
    '[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "vllm/vllm-openai:kimi-k3"\nlaunch = "vllm serve m"\n'
)


def _refusal(load: Any, path: Path, text: str) -> str:
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            RUNNER + '[engine]\nbackend = "sim"\nstall_timout_s = 5\n',
            "runner.toml: [engine]: unknown key 'stall_timout_s' (did you mean 'stall_timeout_s'?)",
        ),
        (RUNNER + 'listn = "127.0.0.1:0"\n', "runner.toml: unknown key 'listn' (did you mean 'listen'?)"),
        (
            RUNNER + "[engine.simm]\nspeed = 2\n",
            "runner.toml: [engine]: unknown table [engine.simm] (did you mean [engine.sim]?)",
        ),
        (
            RUNNER + "[engine.sim]\nsped = 2\n",
            "runner.toml: [engine.sim]: unknown key 'sped' (did you mean 'speed'?)",
        ),
        (RUNNER + '[tls]\ncert = "c"\nkey = "k"\nca = "x"\n', "runner.toml: [tls]: unknown key 'ca'"),
        (
            RUNNER + '[metric]\nlisten = "127.0.0.1:0"\n',
            "runner.toml: unknown table [metric] (did you mean [metrics]?)",
        ),
        # an unknown key is named before any other problem (here: cluster missing, executables not found)
        (
            'name = "r"\nallowed_imagez = ["x"]\n',
            "runner.toml: unknown key 'allowed_imagez' (did you mean 'allowed_images'?)",
        ),
        (
            RUNNER + '[engine]\nexecutables = ["no-such-vllm"]\nbakend = "process"\n',
            "runner.toml: [engine]: unknown key 'bakend' (did you mean 'backend'?)",
        ),
        ("", "runner.toml: the file is empty"),
    ],
)
def test_a_runner_config_with_an_unknown_key_is_refused_naming_it(tmp_path: Path, text: str, said: str) -> None:
    message = _refusal(load_runner_config, tmp_path / "runner.toml", text)
    assert message.startswith(f"{tmp_path}/{said}"), message
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('stor = "k.db"\n' + CLUSTER, "k3repro.toml: unknown key 'stor' (did you mean 'store'?)"),
        (
            CLUSTER.replace("runners", "runnres"),
            "k3repro.toml: [clusters.cluster-a]: unknown key 'runnres' (did you mean 'runners'?)",
        ),
        (
            CLUSTER + "[clusters.cluster-a.request]\nrepeat = 3\n",
            "k3repro.toml: [clusters.cluster-a.request]: unknown key 'repeat' (did you mean 'repeats'?)",
        ),
        (
            CLUSTER + "[clusters.cluster-a.requst]\nrepeats = 3\n",
            "k3repro.toml: [clusters.cluster-a]: unknown table [clusters.cluster-a.requst] "
            "(did you mean [clusters.cluster-a.request]?)",
        ),
        (
            '[runnres.cluster-a]\nrunners = ["127.0.0.1:9"]\n',
            "k3repro.toml: unknown table [runnres]",
        ),
        (
            '[clusterz.cluster-a]\nrunners = ["127.0.0.1:9"]\n',
            "k3repro.toml: unknown table [clusterz] (did you mean [clusters]?)",
        ),
        (
            CLUSTER + '[isolation]\nprovider = "static"\nlable = "iso"\n',
            "k3repro.toml: [isolation]: unknown key 'lable' (did you mean 'label'?)",
        ),
        (
            CLUSTER + '[slack]\nbot_tokn = "xoxb-1"\n',
            "k3repro.toml: [slack]: unknown key 'bot_tokn' (did you mean 'bot_token'?)",
        ),
        (CLUSTER + '[tls]\nca = "ca.pem"\nserver = "r"\n', "k3repro.toml: [tls]: unknown key 'server'"),
        ("", "k3repro.toml: the file is empty"),
        ("# nothing but a comment\n", "k3repro.toml: the file is empty"),
        ('store = "k.db"\n', "k3repro.toml: no cluster is defined"),
    ],
)
def test_a_bot_config_with_an_unknown_key_is_refused_naming_it_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    path = tmp_path / "k3repro.toml"
    message = _refusal(load_bot_config, path, text)
    assert message.startswith(f"{tmp_path}/{said}"), message
    assert "lists no runner address" not in message
    for argv in (["--config", str(path), "runs"], ["--config", str(path), "runners"]):
        assert cli.main(argv) == 2
    assert bot_main.main(["serve", "--config", str(path)]) == 2
    assert bot_main.main(["resume", "--config", str(path), "--check-config"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(said.split(":", 1)[1] in line for line in err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k3repro.toml"]  # no k3repro.db, no k.db


def test_the_console_scripts_refuse_an_empty_config_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "k3repro.toml").write_text("")
    bin_dir = Path(sys.executable).parent
    result = subprocess.run(
        [bin_dir / "k3repro", "--config", "k3repro.toml", "runs"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert (
        result.stderr
        == "k3repro: k3repro.toml: the file is empty; start from deploy/config/k3repro.toml (docs/configuration.md)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k3repro.toml"]


def test_executables_are_only_the_process_backends(tmp_path: Path) -> None:
    for backend in ("docker", "sim"):
        path = tmp_path / f"{backend}.toml"
        path.write_text(RUNNER + f'[engine]\nbackend = "{backend}"\nexecutables = ["no-such-vllm-here"]\n')
        assert load_runner_config(path).engine.executables == ()
    path = tmp_path / "process.toml"
    path.write_text(RUNNER + '[engine]\nbackend = "process"\nexecutables = ["no-such-vllm-here"]\n')
    with pytest.raises(ConfigError, match="executable 'no-such-vllm-here' is not found"):
        load_runner_config(path)
    path.write_text(RUNNER + '[engine]\nbackend = "sim"\nexecutables = "vllm"\n')
    with pytest.raises(ConfigError, match="'executables' must be a list"):
        load_runner_config(path)


def test_a_runner_without_a_name_takes_the_hosts(tmp_path: Path) -> None:
    path = tmp_path / "runner.toml"
    path.write_text('cluster = "a"\nallowed_images = ["x"]\n[engine]\nbackend = "sim"\n')
    assert load_runner_config(path).name == socket.gethostname()


# --- docs/configuration.md and the parsers agree --------------------------------------------------------------


def _documented() -> dict[str, dict[str, set[str]]]:
    """The keys docs/configuration.md lists, by file and table ("" the top level, NAME for a cluster's name)."""
    found: dict[str, dict[str, set[str]]] = {}
    file = ""
    tables: list[str] = []
    for line in DOCS.read_text().splitlines():
        if heading := re.match(r"^## (\S+\.toml)$", line):
            file, tables = heading.group(1), []
            found[file] = {}
        elif line.startswith("## "):
            file, tables = "", []
        elif line.startswith("### ") and file:
            tables = [""] if line == "### top level" else re.findall(r"`\[([^\]]+)\]`", line)
            assert tables, line
            for table in tables:
                found[file].setdefault(table, set())
        elif file and tables and (row := re.match(r"^\| `([a-z_]+)` \|", line)):
            for table in tables:
                found[file][table].add(row.group(1))
    return found


def _expected(schema: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    """A schema's keys as documented: a key that is a table of its own (or of named tables) has a section."""

    def joined(table: str, key: str) -> str:
        return f"{table}.{key}" if table else key

    return {
        table: {k for k in keys if joined(table, k) not in schema and f"{joined(table, k)}.NAME" not in schema}
        for table, keys in schema.items()
    }


def test_the_reference_lists_exactly_the_keys_the_parsers_accept() -> None:
    documented = _documented()
    assert documented["runner.toml"] == _expected(RUNNER_KEYS)
    assert documented["k3repro.toml"] == _expected(BOT_KEYS)
    assert "[engine.sim]" in DOCS.read_text() and "`scenario`" in DOCS.read_text()


def _readers(monkeypatch: pytest.MonkeyPatch) -> list[TomlReader]:
    made: list[TomlReader] = []
    original = TomlReader.__init__

    def recording(self: TomlReader, data: dict[str, Any], origin: str) -> None:
        original(self, data, origin)
        made.append(self)

    monkeypatch.setattr(toml_reader.TomlReader, "__init__", recording)
    return made


def _read_by_table(made: list[TomlReader], origin: str) -> dict[str, set[str]]:
    read: dict[str, set[str]] = {}
    for reader in made:
        if not reader.origin.startswith(origin):  # a shipped data file the parse loaded (the flag table)
            continue
        table = reader.origin.removeprefix(origin).strip().strip("[]")
        table = re.sub(r"^clusters\.[^.]+", "clusters.NAME", table)
        read.setdefault(table, set()).update(reader.read)
    return read


def test_the_runner_parser_reads_every_key_it_accepts_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, certs: DevCerts
) -> None:
    made = _readers(monkeypatch)
    data = {
        "name": "r",
        "cluster": "a",
        "labels": [],
        "listen": "127.0.0.1:0",
        "insecure": False,
        "state_dir": "state",
        "max_concurrent_runs": 1,
        "heartbeat_s": 1,
        "allowed_images": ["x"],
        "baseline_dirs": [],
        "request_bodies": "hash",
        "tls": {"cert": str(certs.runner_cert), "key": str(certs.runner_key), "client_ca": str(certs.ca)},
        "engine": {
            "backend": "process",
            "executables": [sys.executable],
            "sim": {"scenario": "demo", "speed": 2},
            "docker": {"gpus": False, "volumes": [], "env": {}},
        },
        "metrics": {"listen": "127.0.0.1:0"},
    }
    parse_runner_config(data, base=tmp_path, origin="t")
    assert {t: k for t, k in _read_by_table(made, "t").items() if k} == {t: set(k) for t, k in RUNNER_KEYS.items()}


def test_the_bot_parser_reads_every_key_it_accepts_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _readers(monkeypatch)
    isolation = {"provider": "static"}
    data = {
        "store": "k.db",
        "connect_timeout_s": 1,
        "reconnect_for_s": 1,
        "tls": {"ca": "ca.pem"},
        "slack": {"bot_token": "xoxb-1", "signing_secret": "s"},
        "isolation": isolation,
        "clusters": {
            "c": {
                "runners": ["h:1"],
                "image": "i",
                "launch": "vllm serve m",
                "request": {"api": "chat", "body": {}},
                "isolation": isolation,
            }
        },
    }
    parse_bot_config(data, base=tmp_path, origin="t")
    assert {t: k for t, k in _read_by_table(made, "t").items() if k} == {t: set(k) for t, k in BOT_KEYS.items()}


# --- mTLS off loopback ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:0", True),
        ("127.1.2.3:50051", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        ("10.0.0.5:50051", False),
        ("gpu-a1.example.internal:50051", False),
    ],
)
def test_loopback_addresses(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


def _tls(certs: DevCerts, client_ca: bool = True) -> str:
    ca = f'client_ca = "{certs.ca}"\n' if client_ca else ""
    return f'[tls]\ncert = "{certs.runner_cert}"\nkey = "{certs.runner_key}"\n{ca}'


def test_a_runner_off_loopback_needs_mtls_or_says_insecure(tmp_path: Path, certs: DevCerts) -> None:
    sim = '[engine]\nbackend = "sim"\n'
    path = tmp_path / "runner.toml"
    for listen in ("0.0.0.0:50051", "10.1.2.3:50051", "[::]:50051"):
        message = _refusal(load_runner_config, path, RUNNER + f'listen = "{listen}"\n' + sim)
        assert message == (
            f"{path}: listen {listen} is reachable from other hosts and there is no [tls], so anyone could start "
            "runs; configure mTLS ([tls] cert, key, client_ca) or set insecure = true"
        )
    message = _refusal(load_runner_config, path, RUNNER + 'listen = "0.0.0.0:50051"\n' + sim + _tls(certs, False))
    assert "[tls] has no client_ca" in message
    path.write_text(RUNNER + 'listen = "0.0.0.0:50051"\n' + sim + _tls(certs))
    assert load_runner_config(path).mutual_tls
    path.write_text(RUNNER + 'listen = "0.0.0.0:50051"\ninsecure = true\n' + sim)
    assert load_runner_config(path).insecure
    path.write_text(RUNNER + 'listen = "127.0.0.1:0"\n' + sim)
    assert not load_runner_config(path).mutual_tls  # loopback: allowed, with a warning at start (below)


def test_the_runner_script_refuses_an_open_listener_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "runner.toml"
    path.write_text(RUNNER + 'listen = "0.0.0.0:0"\nstate_dir = "state"\n[engine]\nbackend = "sim"\n')
    result = subprocess.run(
        [Path(sys.executable).parent / "k3repro-runner", "serve", "--config", path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"k3repro-runner: {path}: listen 0.0.0.0:0 is reachable from other hosts")
    assert not (tmp_path / "state").exists()


async def _started(data: dict[str, Any], tmp_path: Path) -> None:
    daemon = RunnerDaemon(parse_runner_config(data, base=tmp_path, origin="t"))
    await daemon.start()
    await daemon.stop("test", grace_s=0)


async def test_a_runner_without_mtls_warns_at_start(
    tmp_path: Path, certs: DevCerts, caplog: pytest.LogCaptureFixture
) -> None:
    base = {"name": "r", "cluster": "a", "allowed_images": ["x"], "engine": {"backend": "sim"}}
    caplog.set_level(logging.WARNING, logger="runner.daemon")
    await _started({**base, "listen": "0.0.0.0:0", "insecure": True, "state_dir": "open"}, tmp_path)
    loud = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(loud) == 1 and loud[0].startswith("INSECURE: runner r serves gRPC on 0.0.0.0:0 WITHOUT mTLS")
    caplog.clear()
    await _started({**base, "listen": "127.0.0.1:0", "state_dir": "local"}, tmp_path)
    quiet = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert quiet == ["runner r serves gRPC on 127.0.0.1:0 without mTLS: any process on this host can start runs"]
    caplog.clear()
    tls = {"cert": str(certs.runner_cert), "key": str(certs.runner_key), "client_ca": str(certs.ca)}
    await _started({**base, "listen": "0.0.0.0:0", "tls": tls, "state_dir": "mutual"}, tmp_path)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_refused_tls_file_creates_no_state_dir(tmp_path: Path, certs: DevCerts) -> None:
    path = tmp_path / "runner.toml"
    path.write_text(
        RUNNER
        + 'state_dir = "state"\n[engine]\nbackend = "sim"\n'
        + f'[tls]\ncert = "{tmp_path / "absent.pem"}"\nkey = "{certs.runner_key}"\nclient_ca = "{certs.ca}"\n'
    )
    result = subprocess.run(
        [Path(sys.executable).parent / "k3repro-runner", "serve", "--config", path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "absent.pem" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "state").exists()
