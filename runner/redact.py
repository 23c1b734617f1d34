"""Secret redaction, applied by the runner to everything before it leaves the host."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

MASK = "[REDACTED]"


@dataclass(frozen=True)
class Redactor:
    env_names: re.Pattern[str]
    secret_flags: frozenset[str]
    text: tuple[re.Pattern[str], ...]

    def line(self, text: str) -> str:
        for pattern in self.text:
            text = pattern.sub(_mask_match, text)
        return text

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: MASK if self.env_names.search(k) else self.line(v) for k, v in env.items()}

    def argv(self, argv: list[str]) -> list[str]:
        out: list[str] = []
        hide_next = False
        for token in argv:
            name, eq, _ = token.partition("=")
            if hide_next:
                out.append(MASK)
                hide_next = False
            elif name in self.secret_flags:
                out.append(f"{name}={MASK}" if eq else token)
                hide_next = not eq
            else:
                out.append(self.line(token))
        return out


def _mask_match(match: re.Match[str]) -> str:
    if "secret" in match.re.groupindex and match.group("secret") is not None:
        start, end = match.span("secret")
        whole_start = match.start()
        return match.group(0)[: start - whole_start] + MASK + match.group(0)[end - whole_start :]
    return MASK


@cache
def redactor() -> Redactor:
    text = resources.files("runner.data").joinpath("redaction.toml").read_text(encoding="utf-8")
    rules = tomllib.loads(text)
    return Redactor(
        env_names=re.compile("|".join(rules["env_name_patterns"]), re.IGNORECASE),
        secret_flags=frozenset(rules["secret_flags"]),
        text=tuple(re.compile(p) for p in rules["text_patterns"]),
    )
