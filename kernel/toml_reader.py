"""Typed reading of TOML config files, with errors that name the file and the key."""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Collection
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar


class ConfigError(ValueError):
    """A config file that cannot be used; the message is one line naming the file and the key."""


_REQUIRED = object()
# A possessive quantifier on a group (`(?:a|b)*+`): CPython 3.11.2 (Debian bookworm's) fails to match some such
# patterns that later 3.11 releases match. An atomic group around a greedy one, `(?>(?:a|b)*)`, means the same.
_POSSESSIVE_GROUP = re.compile(r"(?<!\\)\)(?:[*+?]|\{\d*,?\d*\})\+")
_T = TypeVar("_T")


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

    def choice(self, key: str, allowed: Collection[str], default: str | None = None) -> str:
        """A string that must be one of `allowed` (an id of a shared vocabulary, a kind): a typo is refused at load
        time, with what it may be, instead of being read later as something else."""
        value = self.text(key, default)
        if value not in allowed:
            raise self.fail(f"{key!r} must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def optional_choice(self, key: str, allowed: Collection[str]) -> str | None:
        """A choice (see choice) that may be absent."""
        self.read.add(key)
        return self.choice(key, allowed) if key in self.data else None

    def regex(self, key: str) -> re.Pattern[str]:
        """A regular expression, compiled here: a bad one is named by file, row and key when the file is read."""
        return self.compile(self.text(key), key)

    def optional_regex(self, key: str) -> re.Pattern[str] | None:
        """A regular expression (see regex) that may be absent."""
        self.read.add(key)
        return self.regex(key) if key in self.data else None

    def regexes(self, key: str, *, required: bool = False) -> list[re.Pattern[str]]:
        """A list of regular expressions (absent: none, unless `required`), each named by its index when it does
        not compile."""
        return [self.compile(pattern, f"{key}[{i}]") for i, pattern in enumerate(self.texts(key, required=required))]

    def compile(self, pattern: str, key: str, flags: int = 0) -> re.Pattern[str]:
        """`pattern`, the value of `key`, compiled; a bad one, or one that matches otherwise on some Python 3.11
        this runs on, is this table's error."""
        if found := _POSSESSIVE_GROUP.search(pattern):
            raise self.fail(
                f"{key!r} puts a possessive quantifier on a group ({pattern[max(0, found.start() - 20) : found.end()]!r}),"
                " which CPython 3.11.2 can fail to match: write an atomic group around a greedy one, (?>(?:…)*)"
            )
        try:
            return re.compile(pattern, flags)
        except re.error as exc:
            raise self.fail(f"{key!r} is not a regular expression ({exc}): {pattern!r}") from None

    def text_table(
        self, key: str, keys: Collection[str] | None = None, values: Collection[str] | None = None
    ) -> dict[str, str]:
        """A table of strings (absent: empty), its keys and its values each one of those given, where given."""
        table = self.table(key)
        for name, value in table.items():
            if not isinstance(value, str):
                raise self.fail(f"{key}.{name} must be a string, got {value!r}")
            if keys is not None and name not in keys:
                raise self.fail(f"{key}: unknown key {name!r}; expected one of {', '.join(keys)}")
            if values is not None and value not in values:
                raise self.fail(f"{key}.{name} must be one of {', '.join(values)}, got {value!r}")
        return dict(table)

    def whole(self, key: str, default: object = None) -> int:
        result: int = self._get(key, _REQUIRED if default is None else default, (int,), "a whole number")
        return result

    def table(self, key: str) -> dict[str, Any]:
        result: dict[str, Any] = self._get(key, {}, (dict,), "a table")
        return result

    def section(self, key: str, *, required: bool = True) -> TomlReader:
        """A sub-table, read by its own reader (`FILE [key]`); an optional one that is absent reads as empty."""
        data: dict[str, Any] = self._get(key, _REQUIRED if required else {}, (dict,), "a table")
        return TomlReader(data, f"{self.origin} [{key}]")

    def rows(self, key: str, *, required: bool = True) -> list[TomlReader]:
        """An array of tables (`[[key]]`), one reader per row, named by its id or name where it has one; an
        optional one that is absent has no rows."""
        rows: list[Any] = self._get(key, _REQUIRED if required else [], (list,), "an array of tables")
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

    def strictly(self, parse: Callable[[TomlReader], _T]) -> _T:
        """parse(self), then any key it did not ask for refused (a typo, named with the closest key it knows): for
        a parser whose keys are all optional, where `only` would need a second list of them."""
        parsed = parse(self)
        self.only(self.read)
        return parsed

    def unread(self) -> dict[str, Any]:
        """The keys no accessor asked for yet: a row's free-form parameters, after its known keys."""
        return {key: value for key, value in self.data.items() if key not in self.read}

    def fail(self, problem: str) -> ConfigError:
        """An error about this table's values, named like every other (`FILE [[row]] #N (id): problem`)."""
        return ConfigError(f"{self.origin}: {problem}")
