"""What makes whole-file analysis fast without changing its result: a pipe spliced into the spool, compiled
Hyperscan databases and the needles derived from the rules kept on disk between runs, the coloured lines'
expressions only where a buffer has colour."""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import hyperscan
import pytest

from kernel.analyzer import analyze_stream
from kernel.analyzer import needles as needles_module
from kernel.analyzer import scan as scan_module
from kernel.analyzer.reader import InputError
from tests.analyzer_logs import FIRST_ERROR, dense_lines
from tests.test_analyzer_scan import NOISE, scanned, streamed

PATTERNS = (b"\\x45\\x52\\x52\\x4f\\x52", b"Traceback[^\\n]*call")


def _log() -> bytes:
    """A log several times a pipe's buffer, its first error in the middle."""
    lines = dense_lines(random.Random(3), 6000)
    return ("\n".join([*lines[:3000], FIRST_ERROR, *lines[3000:]]) + "\n").encode()


@pytest.fixture
def pipe() -> Iterator[tuple[BinaryIO, bytes]]:
    """A real pipe (as `cat vllm.log | k3repro analyze -` gives), written by a thread."""
    data = _log()
    read_end, write_end = os.pipe()

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), os.fdopen(write_end, "wb") as out:  # a refusal stops reading
            out.write(data)

    writer = threading.Thread(target=write)
    writer.start()
    with os.fdopen(read_end, "rb") as stream:
        yield stream, data
    writer.join()


def _count_splices(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    moved: list[int] = []
    splice = os.splice

    def counted(*args: Any) -> int:
        moved.append(splice(*args))
        return moved[-1]

    monkeypatch.setattr(os, "splice", counted)
    return moved


def test_a_pipe_is_spliced_with_streamings_result(
    pipe: tuple[BinaryIO, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, data = pipe
    moved = _count_splices(monkeypatch)
    read: list[int] = []
    assert analyze_stream(stream, progress=lambda done, _total: read.append(done)) == streamed(data)
    assert sum(moved) > len(data) // 2  # the sniffed head and what the reader held are written, the rest spliced
    assert read[-1] == len(data)


def test_a_spliced_pipe_past_the_limit_is_refused(pipe: tuple[BinaryIO, bytes]) -> None:
    stream, data = pipe
    with pytest.raises(InputError, match="larger than"):
        analyze_stream(stream, max_bytes=len(data) // 2)


def _matches(db: hyperscan.Database) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    db.scan(
        b"x ERROR y\nTraceback (most recent call last):\n",
        match_event_handler=lambda i, _f, t, *_: found.append((i, t)),
    )
    return found


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "k3repro" / "hyperscan"


def test_a_compiled_database_is_stored_and_loaded(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = scan_module._compiled.__wrapped__(PATTERNS)
    assert len(list(cache.glob("*.hsdb"))) == 1

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(hyperscan, "Database", refuse)
    assert _matches(scan_module._compiled.__wrapped__(PATTERNS)) == _matches(compiled) == [(0, 7), (1, 37)]


def test_a_damaged_stored_database_is_compiled_again(cache: Path) -> None:
    scan_module._compiled.__wrapped__(PATTERNS)
    (stored,) = cache.glob("*.hsdb")
    stored.write_bytes(stored.read_bytes()[:100])
    assert _matches(scan_module._compiled.__wrapped__(PATTERNS)) == [(0, 7), (1, 37)]
    assert stored.stat().st_size > 100  # stored again, whole


def test_an_unwritable_cache_only_costs_the_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "k3repro").write_text("a file where the cache's folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _matches(scan_module._compiled.__wrapped__(PATTERNS)) == [(0, 7), (1, 37)]


def test_the_cache_keeps_the_newest_databases(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_module, "_CACHE_FILES", 2)
    names = []
    for i in range(4):
        scan_module._compiled.__wrapped__((b"needle%d" % i,))
        (new,) = (p for p in cache.glob("*.hsdb") if p.name not in names)
        os.utime(new, (i, i))  # stored one after the other, whatever the file system's clock resolution
        names.append(new.name)
    assert sorted(p.name for p in cache.glob("*.hsdb")) == sorted(names[2:])


@pytest.mark.parametrize("chunk", [scan_module.CHUNK_BYTES, 4096])
def test_a_coloured_exception_is_found_in_a_log_mostly_without_colour(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Colour between the exception's name and its colon hides the line from the exception's expression: where
    a buffer has an escape, the coloured lines' expressions find it (in the smallest buffers, the others have
    none)."""
    monkeypatch.setattr(scan_module, "CHUNK_BYTES", chunk)
    plain = [line for line in NOISE if "\x1b" not in line] * 300
    data = ("\n".join([*plain, "\x1b[31mValueError\x1b[0m: boom", *plain]) + "\n").encode()
    result = scanned(data)
    assert result == streamed(data)
    assert result.first_error is not None and result.first_error.line_no == len(plain) + 1


def test_derived_needles_are_stored_and_reused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pattern = re.compile(r"(?:abcdef|ghij\w+kl)\d+: (?P<x>Error)")
    monkeypatch.setattr(needles_module, "_DERIVED", needles_module._Derived())
    needles_module._needles.cache_clear()
    found, shape = needles_module.needles(pattern), needles_module.superset_expression(pattern)
    assert found == frozenset({"Error"}) and shape is not None
    needles_module._DERIVED.write()
    assert len(list(cache.parent.glob("needles-*.json"))) == 1

    def refuse(*_args: Any) -> None:
        raise AssertionError("derived again")

    monkeypatch.setattr(needles_module, "_DERIVED", needles_module._Derived())
    monkeypatch.setattr(needles_module, "_sequence", refuse)
    monkeypatch.setattr(needles_module, "_widen", refuse)
    needles_module._needles.cache_clear()
    assert needles_module.needles(pattern) == found and needles_module.superset_expression(pattern) == shape
    needles_module._needles.cache_clear()


def test_an_unwritable_cache_only_costs_the_derivation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "k3repro").write_text("a file where the cache's folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(needles_module, "_DERIVED", needles_module._Derived())
    needles_module._needles.cache_clear()
    assert needles_module.needles(re.compile("abcdef")) == frozenset({"abcdef"})
    needles_module._DERIVED.write()
    needles_module._needles.cache_clear()
