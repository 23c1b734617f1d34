"""Every redaction pattern runs on every line an engine writes: none may backtrack super-linearly. Each is timed on
adversarial lines built from its own parts, the way tests/test_analyzer_redos.py times the analyzer's rules."""

from __future__ import annotations

import re

import pytest

from kernel import redact
from tests.test_analyzer_redos import slow_inputs


def patterns() -> dict[str, re.Pattern[str]]:
    rules = redact.redactor()
    found = {f"text_patterns[{i}]": pattern for i, pattern in enumerate(rules.text)}
    found |= {name: getattr(redact, name) for name in ("_FLAG_IN_TEXT", "_ENV_IN_TEXT", "_LIST_ITEM", "_CONTROL")}
    found |= {name: getattr(rules, name) for name in ("env_names", "flag_names", "secret_keys")}
    return found


@pytest.mark.parametrize("name", sorted(patterns()))
def test_redaction_pattern_is_linear_on_adversarial_lines(name: str) -> None:
    assert slow_inputs(name, patterns()[name]) == []


@pytest.mark.parametrize(
    "pattern",
    [
        r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",  # the JWT rule before it started at a token
        r"""://[^/\s:@"']*:(?P<secret>(?!\d{1,5}/)[^\s@"']+)@""",  # the URL-password rule before it stopped at ://
    ],
)
def test_the_shapes_catch_the_redaction_rules_that_backtracked(pattern: str) -> None:
    assert slow_inputs("old", re.compile(pattern), first=True)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "eyJ"),
        ("redis://user:pa/ss:word@cache:6379/0", "pa/ss:word"),
        ("postgres://:s3cret@db/x and http://h:8080/path", "s3cret"),
    ],
)
def test_the_linear_rules_still_redact(text: str, secret: str) -> None:
    assert secret not in redact.redactor().line(text)
