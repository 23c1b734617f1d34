"""A deterministic stand-in for the model's tokenizer, chat template and sampler.

Token counts only need to be stable and plausible (about one token per word or punctuation mark, chat
special tokens count as one), and the same prompt must always get the same reply, like vLLM with
temperature 0.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

_TOKEN = re.compile(r"<\|[^|<>\s]*\|>|\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


_IDS = re.compile(r"<(\d+)>")  # a token given by id (a prompt of token ids) stays that id
_VOCAB = 1 << 20
_SEEN: dict[int, str] = {}  # ids handed out, for /detokenize


def token_id(token: str) -> int:
    """A stable id for a token, as /tokenize returns it."""
    by_id = _IDS.fullmatch(token)
    if by_id:
        return int(by_id.group(1))
    digest = hashlib.sha256(token.encode()).digest()
    number = int.from_bytes(digest[:4], "big") % _VOCAB
    _SEEN.setdefault(number, token)
    return number


def token_of(number: int) -> str:
    """The token an id stands for (one this process handed out, else the id itself)."""
    return _SEEN.get(number, f"<{number}>")


def detokenize(tokens: Sequence[str]) -> str:
    text = ""
    for token in tokens:
        glue = "" if not text or not (token[0].isalnum() or token[0] == "_") else " "
        text += glue + token
    return text


def chat_prompt(messages: Sequence[Mapping[str, str]], turn: str, generation_prompt: str) -> str:
    return "".join(turn.format(role=m["role"], content=m["content"]) for m in messages) + generation_prompt


def reply(prompt: Sequence[str], words: Sequence[str], length: int) -> list[str]:
    """`length` tokens of `words`, starting at a place the prompt picks."""
    digest = hashlib.sha256("\x1f".join(prompt).encode()).digest()
    start = int.from_bytes(digest[:8], "big") % len(words)
    return [words[(start + i) % len(words)] for i in range(length)]
