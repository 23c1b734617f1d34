"""The fingerprint as a document: field paths, its rules file, the canonical sha256, and reading one back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from kernel.toml_reader import TomlReader, read_toml

SCHEMA = 1
MAX_BYTES = 8 << 20  # a fingerprint is kilobytes; anything near this is not one
FieldPath = tuple[str, ...]


class FingerprintError(ValueError):
    """A fingerprint file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Rules:
    """kernel/data/fingerprint.toml: env capture, volatile fields, fields that matter."""

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
    path = Path(str(resources.files("kernel.data").joinpath("fingerprint.toml")))
    reader = TomlReader(read_toml(path), str(path))
    return Rules(
        env_names=frozenset(reader.texts("env_names")),
        env_prefixes=tuple(reader.texts("env_prefixes")),
        volatile=tuple(tuple(p.split(".")) for p in reader.texts("volatile")),
        matters=tuple(tuple(p.split(".")) for p in reader.texts("matters")),
    )


@lru_cache(maxsize=8192)  # sealing a scene asks for each of its hundreds of paths
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


def load_fingerprint(path: str, *, unsealed_ok: bool = False) -> dict[str, Any]:
    """Reads a fingerprint file; refuses what is not one, or one edited after it was sealed. `unsealed_ok`
    lets one with no sha256 at all through (written by hand or another tool): its content is still checked."""
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
    return validate(document, path, unsealed_ok=unsealed_ok)


# Fields the baseline checks read, and the JSON types this version writes there ("*": each list item). A
# file with other types (another version, another tool) is refused in one line rather than crash a check.
_STR, _STR_OR_NULL, _OBJ_OR_NULL, _LIST_OR_NULL = (str,), (str, type(None)), (dict, type(None)), (list, type(None))
_TYPES: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("nvml.available", (bool, type(None))),
    ("nvml.driver_version", _STR_OR_NULL),
    ("nvml.cuda_driver_version", _STR_OR_NULL),
    ("nvml.gpus", _LIST_OR_NULL),
    ("nvml.gpus.*", (dict,)),
    ("nvml.gpus.*.name", _STR),
    ("image.ref", _STR),
    ("image.id", _STR_OR_NULL),
    ("image.pinned", (bool, type(None))),
    ("image.pinned_ref", _STR_OR_NULL),
    ("image.repo_digests", _LIST_OR_NULL),
    ("image.repo_digests.*", _STR),
    ("image.env", _OBJ_OR_NULL),
    ("image.env.*", _STR),
    ("image.error", _STR_OR_NULL),
    ("runtime.cuda_runtime", _STR_OR_NULL),
    ("runtime.cuda_runtime_source", _STR_OR_NULL),
    ("runtime.torch_cuda", _STR_OR_NULL),
    ("runtime.cuda_compat", _OBJ_OR_NULL),
    ("runtime.cuda_compat.loaded", (bool, type(None))),
    ("runtime.cuda_compat.driver", _STR_OR_NULL),
    ("runtime.cuda_compat.dirs", _LIST_OR_NULL),
    ("runtime.cuda_compat.dirs.*", _STR),
    ("runtime.cuda_compat.via", _LIST_OR_NULL),
    ("runtime.cuda_compat.via.*", _STR),
    ("runtime.container_nvidia_smi", _OBJ_OR_NULL),
    ("runtime.container_nvidia_smi.available", (bool, type(None))),
    ("runtime.container_nvidia_smi.driver_version", _STR_OR_NULL),
    ("runtime.container_nvidia_smi.cuda_version", _STR_OR_NULL),
    ("runtime.container_nvidia_smi.gpus", _LIST_OR_NULL),
    ("runtime.container_nvidia_smi.gpus.*", _STR),
    ("sha256", _STR_OR_NULL),
)
_REQUIRED = frozenset({"image.ref"})  # read by index, not .get
_KIND = {str: "a string", bool: "true/false", dict: "an object", list: "a list", type(None): "null"}


def _found(node: Any, path: list[str], done: list[str]) -> Iterator[tuple[str, Any]]:
    """The values at `path` below `node` with their dotted paths; absent or null parents yield nothing."""
    if not path:
        yield ".".join(done), node
        return
    head, rest = path[0], path[1:]
    if head == "*":
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, item in items:
            yield from _found(item, rest, [*done, str(key)])
    elif isinstance(node, dict) and head in node:
        yield from _found(node[head], rest, [*done, head])
    elif isinstance(node, dict) and not rest and ".".join([*done, head]) in _REQUIRED:
        raise FingerprintError(f"missing {'.'.join([*done, head])!r}")


def _check_types(document: dict[str, Any]) -> None:
    for pattern, kinds in _TYPES:
        for path, value in _found(document, pattern.split("."), []):
            if not isinstance(value, kinds):
                wanted = " or ".join(_KIND[kind] for kind in kinds)
                shown = json.dumps(value, ensure_ascii=False)
                shown = shown if len(shown) <= 40 else shown[:37] + "..."
                raise FingerprintError(f"{path!r} must be {wanted}, got {shown} (not what this version writes)")


def validate(document: Any, origin: str, *, unsealed_ok: bool = False) -> dict[str, Any]:
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise FingerprintError(f'{origin}: not a k3repro fingerprint (expected an object with "schema": {SCHEMA})')
    for key, kind in (("host", dict), ("nvml", dict), ("runtime", dict), ("env", dict), ("launch", dict)):
        if not isinstance(document.get(key), kind):
            raise FingerprintError(f"{origin}: {key!r} must be an object")
    if document.get("image") is not None and not isinstance(document["image"], dict):
        raise FingerprintError(f"{origin}: 'image' must be an object or null")
    if not isinstance(document.get("changes"), list):
        raise FingerprintError(f"{origin}: 'changes' must be a list")
    try:
        _check_types(document)
    except FingerprintError as exc:
        raise FingerprintError(f"{origin}: {exc}") from None
    if "sha256" not in document:
        if unsealed_ok:
            return document
        raise FingerprintError(
            f"{origin}: unsealed (no sha256: written by hand or by another tool); k3repro check reads it, "
            "this command compares sealed scenes"
        )
    if document["sha256"] != sha256_of(document):
        raise FingerprintError(f"{origin}: sha256 does not match the content (edited after it was taken?)")
    return document


def to_text(document: dict[str, Any]) -> str:
    """The form a fingerprint is printed and stored in (sorted keys, so two files diff line by line too)."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False)
