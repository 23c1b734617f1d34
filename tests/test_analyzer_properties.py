"""Property tests (hypothesis): any text, any bytes, any cut of a traceback never crash the analyzer, and
feeding line by line always equals analyzing the whole text."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest

hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

from kernel.analyzer import InputError, StreamAnalyzer, analyze_stream, analyze_text  # noqa: E402
from tests.test_analyzer_fuzz import PIECES, check_contract  # noqa: E402

settings = hypothesis.settings(max_examples=150, deadline=None)
log_lines = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=200)), max_size=60)


@settings
@hypothesis.given(log_lines)
def test_any_text(lines: list[str]) -> None:
    text = "\n".join(lines)
    check_contract(analyze_text(text), text)


@settings
@hypothesis.given(st.binary(max_size=5000))
def test_any_bytes(data: bytes) -> None:
    with contextlib.suppress(InputError):
        check_contract(analyze_stream(io.BytesIO(data)))


@settings
@hypothesis.given(log_lines)
def test_stream_equals_whole_text(lines: list[str]) -> None:
    text = "\n".join(line.replace("\n", " ") for line in lines)
    analyzer = StreamAnalyzer()
    for line in text.split("\n"):
        analyzer.feed(line, at=0.0)
    analyzer.close()
    whole = analyze_text(text + "\n")
    streamed, final = analyzer.first_error, whole.first_error
    assert (streamed is None) == (final is None)
    if streamed is not None and final is not None:
        # The whole-log result also knows whether an OOM came after the finding was emitted.
        assert replace(streamed, secondary_oom=False, hint="") == replace(final, secondary_oom=False, hint="")
        assert final.secondary_oom == analyzer.secondary_oom
    assert analyzer.phases_seen == whole.phases_seen


@settings
@hypothesis.given(st.integers(min_value=1, max_value=200_000), st.sampled_from(PIECES))
def test_huge_line(size: int, piece: str) -> None:
    check_contract(analyze_text(piece * (size // max(1, len(piece)) + 1)))
