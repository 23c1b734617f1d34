"""The fingerprint as a document: field paths, its rules file, the canonical sha256, and reading one back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from runner.toml_reader import TomlReader, read_toml

SCHEMA = 1
MAX_BYTES = 8 << 20  # a fingerprint is kilobytes; anything near this is not one
FieldPath = tuple[str, ...]


class FingerprintError(ValueError):
    """A fingerprint file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Rules:
    """runner/data/fingerprint.toml: env capture, volatile fields, fields that matter."""

    env_names: frozenset[str]
    env_prefixes: tuple[str, ...]
    volatile: tuple[FieldPath, ...]
    matters: tuple[FieldPath, ...]

    def is_volatile(self, path: FieldPath) -> bool:
        return _covered(path, self.volatile)

    def matters_for(self, path: FieldPath) -> bool:
        return _covered(path, self.matters)

    def wants_env(self, name: str) -> bool:
        return name in self.env_names or name.startswith(self.env_prefixes)


@cache
def rules() -> Rules:
    path = Path(str(resources.files("runner.data").joinpath("fingerprint.toml")))
    reader = TomlReader(read_toml(path), str(path))
    return Rules(
        env_names=frozenset(reader.texts("env_names")),
        env_prefixes=tuple(reader.texts("env_prefixes")),
        volatile=tuple(tuple(p.split(".")) for p in reader.texts("volatile")),
        matters=tuple(tuple(p.split(".")) for p in reader.texts("matters")),
    )


def _covered(path: FieldPath, patterns: tuple[FieldPath, ...]) -> bool:
    """A pattern covers a path when it matches the path's leading segments, `*` one segment each."""
    return any(
        len(pattern) <= len(path) and all(fnmatchcase(seg, pat) for seg, pat in zip(path, pattern, strict=False))
        for pattern in patterns
    )


def leaves(value: Any, path: FieldPath = ()) -> Iterator[tuple[FieldPath, Any]]:
    """Every scalar of a JSON value with its path; empty containers are leaves too (they differ from null)."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, (*path, str(key)))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from leaves(item, (*path, str(index)))
    else:
        yield path, value


def stable_part(document: Any, path: FieldPath = ()) -> Any:
    """The document without its volatile fields: what the sha256 covers."""
    if isinstance(document, dict):
        return {k: stable_part(v, (*path, k)) for k, v in document.items() if not rules().is_volatile((*path, k))}
    if isinstance(document, list):
        return [stable_part(v, (*path, str(i))) for i, v in enumerate(document)]
    return document


def sha256_of(document: dict[str, Any]) -> str:
    canonical = json.dumps(stable_part(document), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def seal(document: dict[str, Any]) -> dict[str, Any]:
    """The document with its sha256 set (content address of the scene, volatile fields excluded)."""
    return {**document, "sha256": sha256_of(document)}


def load_fingerprint(path: str) -> dict[str, Any]:
    """Reads a fingerprint file; refuses what is not one, or one edited after it was sealed."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise FingerprintError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise FingerprintError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a fingerprint")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FingerprintError(f"{path}: not JSON ({exc})") from None
    return validate(document, path)


def validate(document: Any, origin: str) -> dict[str, Any]:
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise FingerprintError(f'{origin}: not a k3repro fingerprint (expected an object with "schema": {SCHEMA})')
    for key, kind in (("host", dict), ("nvml", dict), ("runtime", dict), ("env", dict), ("launch", dict)):
        if not isinstance(document.get(key), kind):
            raise FingerprintError(f"{origin}: {key!r} must be an object")
    if document.get("image") is not None and not isinstance(document["image"], dict):
        raise FingerprintError(f"{origin}: 'image' must be an object or null")
    if not isinstance(document.get("changes"), list):
        raise FingerprintError(f"{origin}: 'changes' must be a list")
    if document.get("sha256") != sha256_of(document):
        raise FingerprintError(f"{origin}: sha256 does not match the content (edited after it was taken?)")
    return document


def to_text(document: dict[str, Any]) -> str:
    """The form a fingerprint is printed and stored in (sorted keys, so two files diff line by line too)."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False)
