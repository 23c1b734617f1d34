"""Field-level differences between two fingerprints: what matters apart from noise."""

from __future__ import annotations

import json
from typing import Any

from kernel.fingerprint.caches import summary
from kernel.fingerprint.document import leaves, rules

KINDS = ("matters", "other", "noise")
_ABSENT = object()


def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`matters`: driver, CUDA, image digest, versions, GPU model/count, env, argv; `noise`: times, memory
    in use, pids; `other`: the rest (hostname, uuids ...). Equal sha256 means no difference outside noise."""
    left, right = dict(leaves(a)), dict(leaves(b))
    differences: list[dict[str, Any]] = []
    for path in sorted(left.keys() | right.keys()):
        if path == ("sha256",):
            continue
        old, new = left.get(path, _ABSENT), right.get(path, _ABSENT)
        if old == new:
            continue
        kind = "noise" if rules().is_volatile(path) else "matters" if rules().matters_for(path) else "other"
        differences.append(
            {
                "path": ".".join(path),
                "kind": kind,
                "a": None if old is _ABSENT else old,
                "b": None if new is _ABSENT else new,
            }
        )
    differences.sort(key=lambda d: KINDS.index(d["kind"]))
    return {
        "a": a.get("sha256"),
        "b": b.get("sha256"),
        "same_scene": a.get("sha256") == b.get("sha256"),
        "differences": differences,
        "caches": cache_changes(a, b),
    }


def _caches(scene: dict[str, Any]) -> dict[str, dict[str, Any]]:
    section = scene.get("caches")
    found = section.get("caches") if isinstance(section, dict) else None
    return {str(c.get("name")): c for c in found or [] if isinstance(c, dict)}


def cache_changes(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Each cache whose location or contents differ between two scenes: `{"name", "a", "b"}`, each side in a
    few words (`absent`, or its path, entries, bytes, newest entry and index hash)."""
    left, right = _caches(a), _caches(b)
    names = list(left) + [name for name in right if name not in left]
    changes = []
    for name in names:
        old, new = left.get(name), right.get(name)
        keys = ("path", "exists", "size_bytes", "entries", "newest_mtime", "index_sha256", "truncated")
        if old is not None and new is not None and all(old.get(k) == new.get(k) for k in keys):
            continue
        changes.append({"name": name, "a": summary(old), "b": summary(new)})
    return changes


def diff_text(result: dict[str, Any]) -> str:
    lines = [f"A sha256 {result['a']}", f"B sha256 {result['b']}"]
    if result["same_scene"]:
        lines.append("same scene (no difference outside noise)")
    for kind in KINDS:
        group = [d for d in result["differences"] if d["kind"] == kind]
        if not group:
            continue
        if kind == "other":  # the caches' fields are shown per cache below
            group = [d for d in group if not d["path"].startswith("caches.")]
            if not group:
                continue
        lines.append(f"{kind} ({len(group)}):")
        if kind == "noise":
            lines.append("  " + ", ".join(d["path"] for d in group))
            continue
        lines += [f"  {d['path']}: {_show(d['a'])} → {_show(d['b'])}" for d in group]
    if changes := result.get("caches"):
        lines.append(f"caches ({len(changes)}, host paths):")
        lines += [f"  {c['name']}: {c['a']} → {c['b']}" for c in changes]
    return "\n".join(lines)


def _show(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value, ensure_ascii=False)
