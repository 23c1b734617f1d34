"""Typed reading of TOML config files, with errors that name the file and the key."""

from __future__ import annotations

import tomllib
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


class TomlReader:
    """Typed access to a TOML table with errors that name the file and key."""

    def __init__(self, data: dict[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin

    def _get(self, key: str, default: object, kinds: tuple[type, ...], what: str) -> Any:
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

    def number(self, key: str, default: float) -> float:
        return float(self._get(key, default, (int, float), "a number"))

    def texts(self, key: str) -> list[str]:
        values: list[Any] = self._get(key, [], (list,), "a list of strings")
        if not all(isinstance(v, str) for v in values):
            raise ConfigError(f"{self.origin}: {key!r} must be a list of strings")
        return values

    def table(self, key: str) -> dict[str, Any]:
        result: dict[str, Any] = self._get(key, {}, (dict,), "a table")
        return result
