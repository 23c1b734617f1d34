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
