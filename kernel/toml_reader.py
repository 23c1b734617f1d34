"""Typed reading of TOML config files, with errors that name the file and the key."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Collection
from importlib import resources
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config file that cannot be used; the message is one line naming the file and the key."""


_REQUIRED = object()


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def packaged(name: str, home: str = "kernel.data") -> TomlReader:
    """A data file shipped in a package's data folder (kernel/data, or runner/data for the runner's own), through
    the same typed reader as a config: a bad row of ladder.toml or proxies.toml is named by file, row and key,
    never a KeyError from deep inside a stage."""
    origin = f"{home.replace('.', '/')}/{name}"
    try:
        data = tomllib.loads(resources.files(home).joinpath(name).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    return TomlReader(data, origin)


def unknown_keys(data: dict[str, Any], known: Collection[str], file: str, table: str = "") -> str | None:
    """What is wrong with the keys of one table, in one line naming the file, the table and each unknown key
    with the closest known one (`k3repro.toml: [engine]: unknown key 'stall_timout_s' (did you mean
    'stall_timeout_s'?)`); None when every key is known."""
    problems = []
    for key in data:
        if key in known:
            continue
        close = difflib.get_close_matches(key, list(known), n=1)
        if isinstance(data[key], dict):  # a table header: [engine.simm], [metric]
            prefix = f"{table}." if table else ""
            problems.append(
                f"unknown table [{prefix}{key}]" + (f" (did you mean [{prefix}{close[0]}]?)" if close else "")
            )
        else:
            problems.append(f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if not problems:
        return None
    where = f"{file}: [{table}]" if table else file
    return f"{where}: {'; '.join(problems)}"


def strict(data: dict[str, Any], known: Collection[str], file: str, table: str = "") -> TomlReader:
    """A reader of one table that refuses keys it does not know, before any value is read (so a typo is named
    as a typo, not as the missing key it was meant to be). Its origin is `FILE [TABLE]`, as everywhere."""
    if not isinstance(data, dict):
        where = f"{file}: [{table}]" if table else file
        raise ConfigError(f"{where}: must be a table")
    problem = unknown_keys(data, known, file, table)
    if problem is not None:
        raise ConfigError(problem)
    return TomlReader(data, f"{file} [{table}]" if table else file)


class TomlReader:
    """Typed access to a TOML table with errors that name the file and key. `read` holds every key asked for
    (present or not): what a parser knows, which a test compares with the keys it declares."""

    def __init__(self, data: dict[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin
        self.read: set[str] = set()

    def value(self, key: str, default: Any = None) -> Any:
        """The raw value (any type), for keys a parser checks itself."""
        self.read.add(key)
        return self.data.get(key, default)

    def _get(self, key: str, default: object, kinds: tuple[type, ...], what: str) -> Any:
        self.read.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise ConfigError(f"{self.origin}: missing key {key!r}")
            return default
        value = self.data[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ConfigError(f"{self.origin}: {key!r} must be {what}, got {value!r}")
        return value

    def text(self, key: str, default: object = None) -> str:
        result: str = self._get(key, _REQUIRED if default is None else default, (str,), "a string")
        return result

    def flag(self, key: str, default: bool) -> bool:
        return bool(self._get(key, default, (bool,), "true or false"))

    def number(self, key: str, default: float | None = None) -> float:
        return float(self._get(key, _REQUIRED if default is None else default, (int, float), "a number"))

    def texts(self, key: str, *, required: bool = False) -> list[str]:
        values: list[Any] = self._get(key, _REQUIRED if required else [], (list,), "a list of strings")
        if not all(isinstance(v, str) for v in values):
            raise ConfigError(f"{self.origin}: {key!r} must be a list of strings")
        return values

    def whole(self, key: str, default: object = None) -> int:
        result: int = self._get(key, _REQUIRED if default is None else default, (int,), "a whole number")
        return result

    def table(self, key: str) -> dict[str, Any]:
        result: dict[str, Any] = self._get(key, {}, (dict,), "a table")
        return result

    def section(self, key: str) -> TomlReader:
        """A required sub-table, read by its own reader (`FILE [key]`)."""
        data: dict[str, Any] = self._get(key, _REQUIRED, (dict,), "a table")
        return TomlReader(data, f"{self.origin} [{key}]")

    def rows(self, key: str) -> list[TomlReader]:
        """An array of tables (`[[key]]`), one reader per row, named by its id or name where it has one."""
        rows: list[Any] = self._get(key, _REQUIRED, (list,), "an array of tables")
        readers = []
        for number, row in enumerate(rows, 1):
            label = row.get("id", row.get("name")) if isinstance(row, dict) else None
            where = f"{self.origin} [[{key}]] #{number}" + (f" ({label})" if isinstance(label, str) else "")
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: must be a table")
            readers.append(TomlReader(row, where))
        return readers

    def only(self, known: Collection[str]) -> TomlReader:
        """This table, after refusing any key not in `known` (a typo is named as one, with the closest key)."""
        if (problem := unknown_keys(self.data, known, self.origin)) is not None:
            raise ConfigError(problem)
        return self

    def unread(self) -> dict[str, Any]:
        """The keys no accessor asked for yet: a row's free-form parameters, after its known keys."""
        return {key: value for key, value in self.data.items() if key not in self.read}

    def fail(self, problem: str) -> ConfigError:
        """An error about this table's values, named like every other (`FILE [[row]] #N (id): problem`)."""
        return ConfigError(f"{self.origin}: {problem}")
