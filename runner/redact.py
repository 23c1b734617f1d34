"""Secret redaction, applied by the runner to everything before it leaves the host.

A secret becomes `[REDACTED:<8 hex>]`, a keyed hash of its value: the same secret gets the same
placeholder wherever it appears (env, argv, logs) and a changed secret gets another one, so two redacted
fingerprints still diff correctly and an unchanged scene keeps its sha256. The key is
$K3REPRO_REDACTION_KEY when set (stable across processes and hosts), else random per process (stable
within a run), so a placeholder cannot be brute-forced back into a short password.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

KEY_ENV = "K3REPRO_REDACTION_KEY"
PLACEHOLDER = re.compile(r"\[REDACTED:[0-9a-f]{8}\]")


@dataclass(frozen=True)
class Redactor:
    env_names: re.Pattern[str]
    secret_flags: frozenset[str]
    text: tuple[re.Pattern[str], ...]
    key: bytes

    def mask(self, secret: str) -> str:
        """The placeholder of one secret value."""
        if PLACEHOLDER.fullmatch(secret):
            return secret  # already redacted: redaction is idempotent
        return f"[REDACTED:{hmac.new(self.key, secret.encode(), hashlib.sha256).hexdigest()[:8]}]"

    def line(self, text: str) -> str:
        for pattern in self.text:
            text = pattern.sub(self._mask_match, text)
        return text

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: self.mask(v) if self.env_names.search(k) else self.line(v) for k, v in env.items()}

    def argv(self, argv: list[str]) -> list[str]:
        out: list[str] = []
        hide_next = False
        for token in argv:
            name, eq, value = token.partition("=")
            if hide_next:
                out.append(self.mask(token))
                hide_next = False
            elif name in self.secret_flags:
                out.append(f"{name}={self.mask(value)}" if eq else token)
                hide_next = not eq
            else:
                out.append(self.line(token))
        return out

    def _mask_match(self, match: re.Match[str]) -> str:
        if PLACEHOLDER.fullmatch(match.group(0)):
            return match.group(0)
        if "secret" in match.re.groupindex and match.group("secret") is not None:
            start, end = match.span("secret")
            whole = match.start()
            text = match.group(0)
            return text[: start - whole] + self.mask(match.group("secret")) + text[end - whole :]
        return self.mask(match.group(0))


@cache
def redactor() -> Redactor:
    text = resources.files("runner.data").joinpath("redaction.toml").read_text(encoding="utf-8")
    rules = tomllib.loads(text)
    key = os.environ.get(KEY_ENV, "").encode() or os.urandom(32)
    return Redactor(
        env_names=re.compile("|".join(rules["env_name_patterns"]), re.IGNORECASE),
        secret_flags=frozenset(rules["secret_flags"]),
        text=tuple(re.compile(p) for p in rules["text_patterns"]),
        key=key,
    )
