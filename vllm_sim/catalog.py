"""The error catalog (vllm_sim/data/errors.toml): how each failure reads, process by process.

A failure is a list of blocks in the order vLLM's processes write them: the root cause in the process
that raised it, then the wrappers other processes add (`EngineCore failed to start.`, `Engine core
initialization failed. See root cause above.` ...). The layout depends on where the error was raised
and whether the TP workers are processes of their own, so the catalog stores the pieces and this
module assembles them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from kernel.toml_reader import ConfigError, TomlReader
from vllm_sim.datafiles import reader
from vllm_sim.logwriter import Role
from vllm_sim.scenario import PHASES


@dataclass(frozen=True)
class ErrorSpec:
    key: str
    phase: str
    raised_in: str  # worker | engine | api
    at: str  # start-up line the failing process never writes ("" for the request phase)
    only: frozenset[str]
    logged: str
    logged_file: str
    frames: tuple[str, ...]
    exception: str


@dataclass(frozen=True)
class Block:
    """One process's share of a failure."""

    role: Role
    rank: int
    delay: float  # simulated seconds after the previous block
    logged: str  # an ERROR line written before the traceback ("" for none)
    logged_file: str
    header: str  # logged exception message; "" for a bare traceback on stderr
    file: str
    title: str  # the line before a bare traceback (e.g. "Process EngineCore:")
    frames: tuple[str, ...]
    exception: tuple[str, ...]
    traceback: bool = True  # False: the exception without its traceback


@dataclass(frozen=True)
class HttpError:
    status: int
    type: str
    param: str | None  # a format string like message
    message: str
    log: str = ""  # the line the API server logs for it ("" for none), a format string over message too
    log_level: str = "INFO"
    log_file: str = ""
    log_routes: frozenset[str] = frozenset()


def _lines(text: str) -> tuple[str, ...]:
    return tuple(line for line in text.split("\n") if line)


_ERROR_KEYS = ("phase", "raised_in", "at", "only", "logged", "logged_file", "frames", "exception")
_HTTP_KEYS = ("status", "type", "param", "message", "log", "log_level", "log_file", "log_routes")


def _entries(data: TomlReader, table: str, known: tuple[str, ...]) -> list[tuple[str, TomlReader]]:
    """The entries of a keyed table (`[error.KEY]`), each a reader named `FILE [table] [KEY]` that refuses keys
    it does not know."""
    entries = data.section(table)
    return [(key, entries.section(key).only(known)) for key in entries.data]


def _error(key: str, raw: TomlReader) -> ErrorSpec:
    return ErrorSpec(
        key=key,
        phase=raw.text("phase"),
        raised_in=raw.text("raised_in"),
        at=raw.text("at", ""),
        only=frozenset(raw.texts("only")),
        logged=raw.text("logged", ""),
        logged_file=raw.text("logged_file", ""),
        frames=_lines(raw.text("frames")),
        exception=raw.text("exception"),
    )


def _http(raw: TomlReader) -> HttpError:
    return HttpError(
        raw.whole("status"),
        raw.text("type"),
        raw.text("param") if "param" in raw.data else None,
        raw.text("message"),
        raw.text("log", ""),
        raw.text("log_level", "INFO"),
        raw.text("log_file", ""),
        frozenset(raw.texts("log_routes")),
    )


class Catalog:
    def __init__(self, data: TomlReader) -> None:
        self._fragments: dict[str, str] = dict(data.table("fragment"))
        self._origins: dict[str, dict[str, Any]] = dict(data.table("origin"))
        self._wrappers: dict[str, dict[str, Any]] = dict(data.table("wrapper"))
        self._response_error: dict[str, str] = dict(data.table("response_error"))
        self.errors = {key: _error(key, raw) for key, raw in _entries(data, "error", _ERROR_KEYS)}
        self.http = {key: _http(raw) for key, raw in _entries(data, "http", _HTTP_KEYS)}
        self._check(data.origin)

    def _check(self, origin: str) -> None:
        """Catalog mistakes are programming errors: fail when it is loaded, not halfway through a failure."""
        for spec in self.errors.values():
            where_error = f"{origin} [error] [{spec.key}]"
            if spec.phase not in PHASES:
                raise ConfigError(f"{where_error}: unknown phase {spec.phase!r}")
            wheres = {"worker": ("worker", "uni"), "engine": ("engine",), "api": ("api",)}.get(spec.raised_in)
            if wheres is None:
                raise ConfigError(f"{where_error}: 'raised_in' must be worker, engine or api, got {spec.raised_in!r}")
            for where in (f"{where}.{spec.phase}" for where in wheres):
                if where not in self._origins:
                    raise ConfigError(f"{where_error}: no [origin.{where!r}]")
                for name in self._origins[where]["then"]:
                    if name not in self._wrappers:
                        raise ConfigError(f"{origin} [origin.{where}]: unknown wrapper {name!r}")

    def phases(self) -> dict[str, str]:
        return {key: spec.phase for key, spec in self.errors.items()}

    def spec(self, error: str, phase: str) -> ErrorSpec:
        """A catalog error by key, or an error given by its text: raised where that phase's errors are raised
        (the API server for api_listen, a TP worker otherwise), with no frames of its own."""
        if error in self.errors:
            return self.errors[error]
        return ErrorSpec(
            key="",
            phase=phase,
            raised_in="api" if phase == "api_listen" else "worker",
            at="",
            only=frozenset(),
            logged="",
            logged_file="",
            frames=(),
            exception=error.replace("{", "{{").replace("}", "}}"),  # verbatim, not a format string
        )

    def blocks(
        self, spec: ErrorSpec, rank: int, multiproc: bool, values: Mapping[str, object], *, traceback: bool = True
    ) -> list[Block]:
        """The failure `spec` raised on TP rank `rank`, rendered with the simulated facts (none without a text)."""
        if not spec.exception:
            return []
        where = {"worker": "worker" if multiproc else "uni", "engine": "engine", "api": "api"}[spec.raised_in]
        role: Role = "worker" if where == "worker" else "api" if where == "api" else "engine"
        names: dict[str, object] = {**values, "rank": rank}
        names.update({name: text.format(**names) for name, text in self._fragments.items()})
        exception = _lines(spec.exception.format(**names))
        names["root_message"] = exception[0].partition(": ")[2]
        origin = self._origins[f"{where}.{spec.phase}"]
        blocks = [
            Block(
                role=role,
                rank=rank if role == "worker" else 0,
                delay=0.0,
                logged=spec.logged.format(**names),
                logged_file=spec.logged_file,
                header=origin.get("header", ""),
                file=origin.get("file", ""),
                title="",
                frames=_lines(origin["stack"]) + spec.frames if traceback else (),
                exception=exception,
                traceback=traceback,
            )
        ]
        for name in origin["then"]:
            wrapper = self._wrappers[name]
            previous = blocks[-1]
            repeat = bool(wrapper.get("repeat_previous", False))
            blocks.append(
                Block(
                    role=cast(Role, wrapper["proc"]),
                    rank=0,
                    delay=float(wrapper["delay"]),
                    logged="",
                    logged_file="",
                    header=wrapper.get("header", ""),
                    file=wrapper.get("file", ""),
                    title=wrapper.get("title", ""),
                    frames=_lines(wrapper["stack"]) + (previous.frames if repeat else ()),
                    exception=previous.exception if repeat else _lines(wrapper["exception"].format(**names)),
                )
            )
        return blocks

    def response_error(self, text: str, traceback: bool) -> Block:
        """The API server's log of a request it answers with an error while it goes on serving."""
        raw = self._response_error
        return Block(
            role="api",
            rank=0,
            delay=0.0,
            logged="",
            logged_file="",
            header=raw["header"],
            file=raw["file"],
            title="",
            frames=_lines(raw["stack"]) if traceback else (),
            exception=_lines(text),
            traceback=traceback,
        )

    def http_body(self, key: str, **names: object) -> tuple[int, dict[str, object]]:
        """An HTTP error as vLLM 0.32 returns it: status and `{"error": {...}}` body."""
        error = self.http[key]
        body = {
            "message": error.message.format(**names),
            "type": error.type,
            "param": None if error.param is None else error.param.format(**names),
            "code": error.status,
        }
        return error.status, {"error": body}

    def http_log(self, key: str, route: str, message: str) -> tuple[str, str, str] | None:
        """The (level, file, text) line vLLM logs for this error on this route, if any."""
        error = self.http[key]
        if not error.log or route not in error.log_routes:
            return None
        return error.log_level, error.log_file, error.log.format(message=message)


@cache
def catalog() -> Catalog:
    return Catalog(reader("errors.toml"))
