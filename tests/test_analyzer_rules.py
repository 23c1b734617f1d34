"""rules.toml: every rule's example lines, and the loader's checks against the shared vocabulary."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from kernel.analyzer import RulesError, analyze_text, default_rules, load_rules
from kernel.analyzer.rules import ErrorRule, parse_rules
from kernel.toml_reader import ConfigError
from protos.vocab import CATEGORIES, PHASES, UNKNOWN_PHASE

RULES = default_rules()
EXAMPLES = [(rule, example) for rule in RULES.rules for example in rule.examples]


def shipped() -> dict[str, Any]:
    return tomllib.loads(resources.files("kernel.analyzer").joinpath("rules.toml").read_text(encoding="utf-8"))


def test_every_rule_has_an_example() -> None:
    assert [rule.id for rule in RULES.rules if not rule.examples] == []


@pytest.mark.parametrize(("rule", "example"), EXAMPLES, ids=[f"{r.id}:{i}" for i, (r, _) in enumerate(EXAMPLES)])
def test_example_is_matched_by_its_rule_first(rule: ErrorRule, example: str) -> None:
    assert RULES.rule_gate.search(example)
    first = next(r for r in RULES.rules if r.pattern.search(example))
    assert first.id == rule.id


@pytest.mark.parametrize(("rule", "example"), EXAMPLES, ids=[f"{r.id}:{i}" for i, (r, _) in enumerate(EXAMPLES)])
def test_example_alone_is_analyzed_as_its_rule_says(rule: ErrorRule, example: str) -> None:
    error = analyze_text(example).first_error
    if rule.kind == "benign":
        assert error is None
        return
    assert error is not None
    assert error.line == example
    if rule.category is not None:
        assert error.category == rule.category
    if rule.phase_fixed or (rule.phase_usual and rule.kind == "root"):
        assert error.phase == rule.phase
    elif rule.kind != "wrapper":
        # One line and nothing else: no marker, frame or wrapper places it, and the analyzer does not guess.
        assert (error.phase, error.phase_from) == (UNKNOWN_PHASE, "unknown")
    assert error.phase in [*PHASES, UNKNOWN_PHASE] and error.category in CATEGORIES
    assert error.secondary_oom == rule.secondary_oom


def test_shipped_rules_cover_the_vocabulary() -> None:
    assert set(RULES.hints) == {*CATEGORIES, "secondary_oom"}
    assert {m.phase for m in RULES.markers} == set(PHASES) - {"container_init"}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["rule"][0].update(category="gpu_oom"),
            r"\[\[rule\]\] #1 \(\S+\): 'category' must be one of .*'gpu_oom'",
        ),
        (lambda d: d["marker"][0].update(phase="warmup"), r"\[\[marker\]\] #1: 'phase' must be one of .*'warmup'"),
        (lambda d: d["rule"][0].update(pattern="(unclosed"), r"\[\[rule\]\] #1 \(\S+\): 'pattern' is not a regular"),
        (
            lambda d: d["rule"][0].update(kind="maybe"),
            r"'kind' must be one of root, wrapper, benign, weak, got 'maybe'",
        ),
        (lambda d: d["rule"][1].update(id=d["rule"][0]["id"]), r"^rules.toml: duplicate rule ids"),
        (lambda d: d["rule"][0].update(hint="use {nothing}"), r"'hint' names \{nothing\}, not a group of the pattern"),
        (lambda d: d["hints"].pop("oom"), r"^rules.toml: \[hints\]: no hint for categories: oom$"),
        (lambda d: d["hints"].update(oomm="x"), r"^rules.toml: hints: unknown key 'oomm'"),
        (
            lambda d: d["defaults"].update(category_by_phase={"request": "http"}),
            r"^rules.toml \[defaults\]: category_by_phase.request must be one of .*'http'",
        ),
        (
            lambda d: d["line"].update(wrappers=["ok", "(bad"]),
            r"^rules.toml \[line\]: 'wrappers\[1\]' is not a regular",
        ),
        (lambda d: d["signature"].update(replace=[["x"]]), r"\[signature\]: 'replace'\[0\] must be \[pattern, repl"),
        (lambda d: d["traceback"].pop("frame"), r"^rules.toml \[traceback\]: missing key 'frame'$"),
        (lambda d: d.update(version=2), r"^rules.toml: unsupported version 2"),
        (
            lambda d: d["rule"][0].update(phase_fixd=True),
            r"^rules.toml \[\[rule\]\] #1 \(\S+\): unknown key 'phase_fixd' \(did you mean 'phase_fixed'\?\)$",
        ),
        (
            lambda d: d["defaults"].update(serving_sq=5),
            r"\[defaults\]: unknown key 'serving_sq' \(did you mean 'serving_seq",
        ),
        (lambda d: d.update(markers=[{}]), r"^rules.toml: unknown key 'markers' \(did you mean 'marker'\?\)$"),
    ],
)
def test_bad_rules_are_refused_with_the_entry_named(edit: Any, message: str) -> None:
    data = shipped()
    edit(data)
    with pytest.raises(RulesError, match=message):
        parse_rules(data)


def test_a_bad_rule_row_is_named_by_file_row_id_and_key(tmp_path: Path) -> None:
    """A site's rules file with one bad row: one line naming the file, the row (number and id) and the key, as
    every data file read by kernel.toml_reader says it."""
    text = resources.files("kernel.analyzer").joinpath("rules.toml").read_text(encoding="utf-8")
    number = next(i for i, rule in enumerate(shipped()["rule"], 1) if "hang" not in rule)
    parts = text.split("\n[[rule]]\n")
    parts[number] = 'hang = "yes"\n' + parts[number]
    path = tmp_path / "site-rules.toml"
    path.write_text("\n[[rule]]\n".join(parts))
    with pytest.raises(RulesError) as raised:
        load_rules(path)
    rule_id = shipped()["rule"][number - 1]["id"]
    assert str(raised.value) == f"{path} [[rule]] #{number} ({rule_id}): 'hang' must be true or false, got 'yes'"
    assert isinstance(raised.value, ConfigError)  # caught wherever a bad data file is


def test_load_rules_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(resources.files("kernel.analyzer").joinpath("rules.toml").read_text(encoding="utf-8"))
    assert [r.id for r in load_rules(path).rules] == [r.id for r in RULES.rules]
    path.write_text("version = [")
    with pytest.raises(RulesError, match=str(path)):
        load_rules(path)
