"""Signatures: the first error with everything run-specific removed, so two runs failing the same way
compare equal (the isolated rerun and the method engine compare them)."""

from __future__ import annotations

from kernel.analyzer.rules import Rules


def normalize(rules: Rules, message: str) -> str:
    """The message with timestamps, paths, addresses, hex, pids, ranks and numbers replaced (rules.toml).

    Read as far as the longest message the analyzer signs (a line and the line that names its cause, each cut
    at line.max_chars): a longer text (a server's error answer the stages sign) costs no more than that."""
    text = message[: 2 * rules.line.max_chars + 1]
    for pattern, replacement in rules.signature_replace:
        text = pattern.sub(replacement, text)
    return text.strip()[: rules.signature_max_chars]


def signature(rules: Rules, phase: str, category: str, message: str) -> str:
    """`phase:category:normalized message`: readable in a thread, equal for equal failures."""
    return f"{phase}:{category}:{normalize(rules, message)}"
