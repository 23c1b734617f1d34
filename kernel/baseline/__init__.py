"""Compatibility baselines: a model's official requirements as data, checked against a fingerprint.

A profile is `<name>.toml` in kernel/data/baselines/ or in a user directory (which wins, so a site can
update a baseline when the recipe changes before k3repro ships it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from kernel.baseline.checks import CHECKS
from kernel.baseline.scene_facts import Facts
from kernel.toml_reader import ConfigError, TomlReader, read_toml

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


class CheckStatus(StrEnum):
    """A rule's status in a check report, and the report's verdict (its worst rule; unknown counts as warn)."""

    PASS = "pass"  # noqa: S105 (a status, not a password)
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"


SEVERITIES = (CheckStatus.FAIL, CheckStatus.WARN)  # what a rule that does not hold may be


class BaselineError(ConfigError):
    """An unknown or malformed baseline profile; one line."""


@dataclass(frozen=True)
class Rule:
    id: str
    check: str
    description: str
    severity: CheckStatus  # the status when the rule does not hold: one of SEVERITIES
    params: dict[str, Any]


@dataclass(frozen=True)
class Baseline:
    name: str
    description: str
    rules: tuple[Rule, ...]
    source: str

    def evaluate(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
        """The check report; missing input makes a rule `unknown` and the verdict at best `warn`."""
        facts = Facts(fingerprint)
        results = []
        for rule in self.rules:
            outcome = CHECKS[rule.check][0](facts, rule.params)
            status = (
                CheckStatus.UNKNOWN if outcome.holds is None else CheckStatus.PASS if outcome.holds else rule.severity
            )
            results.append(
                {
                    "id": rule.id,
                    "status": status,
                    "expected": outcome.expected,
                    "actual": outcome.actual,
                    "message": outcome.message,
                    "description": rule.description,
                }
            )
        statuses = {r["status"] for r in results}
        if CheckStatus.FAIL in statuses:
            verdict = CheckStatus.FAIL
        elif statuses & {CheckStatus.WARN, CheckStatus.UNKNOWN}:
            verdict = CheckStatus.WARN
        else:
            verdict = CheckStatus.PASS
        return {
            "baseline": self.name,
            "profile_file": self.source,
            "verdict": verdict,
            "fingerprint_sha256": fingerprint.get("sha256"),
            # no sha256: written by hand or by another tool, so checked as given but not content-addressed
            "sealed": "sha256" in fingerprint,
            "rules": results,
        }


def _shipped() -> Path:
    return Path(str(resources.files("kernel.data").joinpath("baselines")))


def baseline_names(extra_dirs: tuple[Path, ...] = ()) -> list[str]:
    return sorted({p.stem for d in (*extra_dirs, _shipped()) if d.is_dir() for p in d.glob("*.toml")})


def load_baseline(name: str, extra_dirs: tuple[Path, ...] = ()) -> Baseline:
    """The profile `name` from the user directories (first match wins) or the shipped ones."""
    if not _NAME.fullmatch(name):
        raise BaselineError(f"baseline profile name {name!r} is not valid (lower-case letters, digits, . _ -)")
    for directory in (*extra_dirs, _shipped()):
        path = directory / f"{name}.toml"
        if path.is_file():
            return parse_baseline(read_toml(path), str(path))
    known = ", ".join(baseline_names(extra_dirs)) or "none"
    raise BaselineError(f"unknown baseline profile {name!r} (known: {known})")


def parse_baseline(data: dict[str, Any], origin: str) -> Baseline:
    reader = TomlReader(data, origin)
    unknown = set(data) - {"name", "description", "rule"}
    if unknown:
        raise BaselineError(f"{origin}: unknown key {sorted(unknown)[0]!r}")
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list) or not raw_rules:
        raise BaselineError(f"{origin}: needs at least one [[rule]]")
    rules = tuple(_rule(raw, f"{origin} rule[{index}]") for index, raw in enumerate(raw_rules))
    ids = [rule.id for rule in rules]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate:
        raise BaselineError(f"{origin}: rule id {duplicate!r} is used twice")
    return Baseline(reader.text("name"), reader.text("description", ""), rules, origin)


def _rule(raw: Any, origin: str) -> Rule:
    if not isinstance(raw, dict):
        raise BaselineError(f"{origin}: must be a table")
    reader = TomlReader(raw, origin)
    check = reader.text("check")
    if check not in CHECKS:
        raise BaselineError(f"{origin}: unknown check {check!r} (known: {', '.join(CHECKS)})")
    severity = reader.text("severity", CheckStatus.FAIL)
    if severity not in SEVERITIES:
        raise BaselineError(f"{origin}: severity must be {' or '.join(SEVERITIES)}, got {severity!r}")
    spec = CHECKS[check][1]
    params = {k: v for k, v in raw.items() if k not in {"id", "check", "description", "severity"}}
    for key, value in params.items():
        if key not in spec:
            raise BaselineError(f"{origin}: check {check} has no parameter {key!r}")
        kind = spec[key][0]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BaselineError(f"{origin}: {key!r} must be {kind.__name__}, got {value!r}")
    missing = [key for key, (_, required) in spec.items() if required and key not in params]
    if missing:
        raise BaselineError(f"{origin}: check {check} needs {missing[0]!r}")
    return Rule(reader.text("id"), check, reader.text("description", ""), CheckStatus(severity), params)


_MARK = {CheckStatus.PASS: "✓", CheckStatus.WARN: "!", CheckStatus.FAIL: "✗", CheckStatus.UNKNOWN: "?"}


def report_text(report: dict[str, Any]) -> str:
    lines = [f"baseline {report['baseline']}: {report['verdict'].upper()}"]
    if not report.get("sealed", True):
        lines.append("  fingerprint unsealed (no sha256: written by hand or by another tool): checked as given")
    for rule in report["rules"]:
        lines.append(f"  {_MARK[rule['status']]} {rule['id']} [{rule['status']}]: {rule['message']}")
        lines.append(f"      expected {rule['expected']}; found {rule['actual'] or 'nothing'}")
    return "\n".join(lines)
