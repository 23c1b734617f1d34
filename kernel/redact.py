"""Secret redaction: the one path every text takes before it leaves the runner or the bot.

The runner redacts each event where it is emitted (runner/events.py); the bot redacts what it stores and what
it prints or posts (bot/store.py, bot/render.py). Both call `redactor().message` / `.json_text` / `.line`, so
a rule added to kernel/data/redaction.toml holds everywhere at once.

A secret becomes `[REDACTED:<8 hex>]`, a keyed hash of its value: the same secret gets the same
placeholder wherever it appears (env, argv, logs) and a changed secret gets another one, so two redacted
fingerprints still diff correctly and an unchanged scene keeps its sha256. The key is
$K3REPRO_REDACTION_KEY when set (stable across processes and hosts), else random per process (stable
within a run), so a placeholder cannot be brute-forced back into a short password.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from kernel.toml_reader import TomlReader, packaged

KEY_ENV = "K3REPRO_REDACTION_KEY"
PLACEHOLDER = re.compile(r"\[REDACTED:[0-9a-f]{8}\]")
# A flag and its value in free text: `--api_key=x`, `--hf-t x`, `"--api-key", "x"` (a JSON or Python list). A
# flag after a space or comma is no value: in `--trust-remote-code --api-key x` (a command line, as py-spy or a log
# prints it) the value taken is x, not `--api-key`.
_FLAG_IN_TEXT = re.compile(
    r"""(?<![\w-])(?P<name>--[A-Za-z][\w-]*)(?:\\*["'])?(?:=(?:\\*["'])?|(?:\s*[,:]\s*|\s+)(?:\\*["'])?(?!--[A-Za-z]))"""
    r"""(?P<secret>(?:[^\s"',;\[\]()\\]|\\(?!["']))+)"""
)
# An environment-style assignment in free text: `HF_TOKEN=x`, `export DB_PASSWORD="x"`, `"HF_TOKEN": "x"`.
# A quote may come backslash-escaped (JSON quoted in a JSON string): the value stops before `\"`.
_ENV_IN_TEXT = re.compile(
    r"""(?<![\w-])(?P<name>[A-Z][A-Z0-9_]*)(?:\\*["'])?\s*[=:]\s*(?:\\*["'])?(?P<secret>(?:[^\s"',;\\]|\\(?!["']))+)"""
)
# One item of a list printed as Python or JSON does (`'KEY1', "KEY2", 3`): a placeholder, a quoted string, a word
# (a backslash, as in `\"KEY\"`, is neither).
_LIST_ITEM = re.compile(r"""\[REDACTED:[0-9a-f]{8}\]|'(?P<single>[^'\\]*)'|"(?P<double>[^"\\]*)"|[^\s'",\\]+""")
# Terminal control sequences (ANSI CSI/OSC, C0/C1 controls but tab and newline): a crafted text must not
# move the cursor, retitle the terminal or hide a line.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x00-\x08\x0b-\x1f\x7f-\x9f]")

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Redactor:
    env_names: re.Pattern[str]
    secret_flags: frozenset[str]
    text: tuple[re.Pattern[str], ...]
    key: bytes
    flag_names: re.Pattern[str] = re.compile(r"(?!)")
    secret_keys: re.Pattern[str] = re.compile(r"(?!)")

    def mask(self, secret: str) -> str:
        """The placeholder of one secret value."""
        if PLACEHOLDER.fullmatch(secret):
            return secret  # already redacted: redaction is idempotent
        return f"[REDACTED:{self.digest(secret.encode())[:8]}]"

    def digest(self, data: bytes) -> str:
        """HMAC-SHA256 of `data` under the redaction key: recognises equal data without letting anyone who
        reads the digest confirm a guess of what it hashes."""
        return hmac.new(self.key, data, hashlib.sha256).hexdigest()

    def is_secret_flag(self, written: str) -> bool:
        """Whether a flag as written takes a secret. vLLM's parser reads `_` as `-` and accepts any unique
        prefix (`--api-k`); a prefix of a secret flag counts even when ambiguous (the value must not leak
        on its way to the parser's refusal)."""
        if not written.startswith("--") or len(written) < 3:
            return False
        name = "--" + written[2:].replace("_", "-")
        return any(flag.startswith(name) for flag in self.secret_flags) or bool(self.flag_names.search(name[2:]))

    def line(self, text: str) -> str:
        """Free text: secret-looking substrings, secret flags' values and secret env assignments."""
        for pattern in self.text:
            text = pattern.sub(self._mask_match, text)
        text = _FLAG_IN_TEXT.sub(lambda m: self._mask_if(m, self.is_secret_flag(m.group("name"))), text)
        return _ENV_IN_TEXT.sub(lambda m: self._mask_if(m, bool(self.env_names.search(m.group("name")))), text)

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
            elif self.is_secret_flag(name):
                out.append(f"{name}={self.mask(value)}" if eq else token)
                hide_next = not eq
            else:
                out.append(self.line(token))
        return out

    def json_value(self, value: Any) -> Any:
        """A parsed JSON value: secret keys' values masked, string lists read as argv, other strings as text."""
        if isinstance(value, dict):
            return {k: self._mask_all(v) if self._secret_key(k) else self.json_value(v) for k, v in value.items()}
        if isinstance(value, list):
            if value and all(isinstance(v, str) for v in value):
                return self.argv(value)
            return [self.json_value(v) for v in value]
        if isinstance(value, str):
            return self.json_text(value) if value[:1] in ("{", "[") else self.line(value)
        return value

    def json_text(self, text: str) -> str:
        """A JSON document, redacted by structure (so an escaped body inside JSON is reached too), kept
        byte for byte when nothing in it is secret; text that is not JSON is redacted as free text."""
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return self.line(text)
        redacted = self.json_value(value)
        return text if redacted == value else json.dumps(redacted, indent=2 if "\n" in text else None)

    def message(self, message: M) -> M:
        """A copy of a protobuf message with every string in it redacted: JSON artifacts by structure, a
        repeated string (an argv, a log chunk's lines) as an argv, so a secret flag's next token is masked."""
        return map_strings(message, self.line, json_content=self.json_text, texts=self.argv)

    def _mask_all(self, value: Any) -> Any:
        """A secret key's value: a string masked, every string in a list or object under it too."""
        if isinstance(value, str):
            return self.mask(value)
        if isinstance(value, list):
            return [self._mask_all(v) for v in value]
        if isinstance(value, dict):
            return {k: self._mask_all(v) for k, v in value.items()}
        return value

    def _secret_key(self, key: str) -> bool:
        return bool(self.secret_keys.search(key)) or (key.isupper() and bool(self.env_names.search(key)))

    def _mask_if(self, match: re.Match[str], secret: bool) -> str:
        return self._mask_group(match) if secret else match.group(0)

    def _mask_match(self, match: re.Match[str]) -> str:
        if PLACEHOLDER.fullmatch(match.group(0)):
            return match.group(0)
        if "secret_list" in match.re.groupindex and match.group("secret_list") is not None:
            start, end = match.span("secret_list")
            items = _LIST_ITEM.sub(self._mask_item, match.group("secret_list"))
            return match.string[match.start() : start] + items + match.string[end : match.end()]
        if "secret" in match.re.groupindex and match.group("secret") is not None:
            return self._mask_group(match)
        return self.mask(match.group(0))

    def _mask_item(self, match: re.Match[str]) -> str:
        item = match.group("single") if match.group("single") is not None else match.group("double")
        if item is None:  # a placeholder (kept), or a bare word
            return self.mask(match.group(0))
        quote = match.group(0)[0]
        return f"{quote}{self.mask(item)}{quote}" if item else match.group(0)

    def _mask_group(self, match: re.Match[str]) -> str:
        start, end = match.span("secret")
        whole = match.start()
        text = match.group(0)
        return text[: start - whole] + self.mask(match.group("secret")) + text[end - whole :]


def map_strings(
    message: M,
    text: Callable[[str], str],
    *,
    json_content: Callable[[str], str] | None = None,
    texts: Callable[[list[str]], list[str]] | None = None,
) -> M:
    """A copy of a protobuf message with `text` applied to every string in it; an artifact's JSON content
    gets `json_content` and a repeated string field `texts` instead, when given."""
    copy = type(message)()
    copy.CopyFrom(message)
    _map_fields(copy, text, json_content or text, texts or (lambda values: [text(v) for v in values]))
    return copy


def _map_fields(
    message: Message,
    text: Callable[[str], str],
    json_content: Callable[[str], str],
    texts: Callable[[list[str]], list[str]],
) -> None:
    is_json = getattr(message, "media_type", "") == "application/json"
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                _map_fields(item, text, json_content, texts)
        elif field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                value[:] = texts(list(value))
            else:
                change = json_content if is_json and field.name == "content" else text
                setattr(message, field.name, change(value))


def printable(text: str) -> str:
    """Text without terminal control sequences: what a crafted bundle or engine says is shown, never obeyed."""
    return _CONTROL.sub("", text)


@cache
def redactor() -> Redactor:
    rules = packaged("redaction.toml")
    key = os.environ.get(KEY_ENV, "").encode() or os.urandom(32)
    return Redactor(
        env_names=_joined(rules, "env_name_patterns", re.IGNORECASE),
        secret_flags=frozenset(rules.texts("secret_flags", required=True)),
        text=tuple(rules.regexes("text_patterns", required=True)),
        key=key,
        flag_names=_joined(rules, "secret_flag_patterns"),
        secret_keys=_joined(rules, "secret_key_patterns"),
    )


def _joined(rules: TomlReader, key: str, flags: int = 0) -> re.Pattern[str]:
    """The patterns of `key` as one alternation, compiled (and checked) by the reader."""
    return rules.compile("|".join(rules.texts(key, required=True)), key, flags)
