"""The progress line of a long analysis (`k3repro analyze`, `start --log`): nothing for a short one, one line
redrawn on a terminal, a plain line now and then otherwise, and never on stdout (JSON stays parseable)."""

from __future__ import annotations

import argparse
import functools
import io
import json
import random
from pathlib import Path

import pytest

from bot.commands import analyze
from kernel.analyzer.progress import ProgressLine
from tests.analyzer_logs import FIRST_ERROR, dense_lines

MIB = 1 << 20


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nothing_for_a_short_analysis_then_a_plain_line_now_and_then() -> None:
    clock, out = _Clock(), io.StringIO()
    progress = ProgressLine("analyze x.log", out, delay_s=2, every_s=10, clock=clock)
    clock.now += 1
    progress(50 * MIB, 500 * MIB)
    assert out.getvalue() == ""
    clock.now += 1.5
    progress(100 * MIB, 500 * MIB)
    clock.now += 5
    progress(300 * MIB, 500 * MIB)  # within every_s of the last line: not written
    clock.now += 6
    progress(450 * MIB, 500 * MIB)
    progress.close()
    assert out.getvalue().splitlines() == [
        "analyze x.log: 100 of 500 MiB (40 MiB/s)",
        "analyze x.log: 450 of 500 MiB (33 MiB/s)",
    ]


def test_a_terminal_gets_one_line_redrawn_and_erased_at_the_end() -> None:
    clock, out = _Clock(), _Terminal()
    with ProgressLine("reading -", out, delay_s=2, clock=clock) as progress:
        clock.now += 2
        progress(64 * MIB, None)  # a pipe: the size is not known while it is read
        clock.now += 1
        progress(96 * MIB, None)
    assert out.getvalue() == (
        "\rreading -: 64 MiB read (32 MiB/s)\x1b[K\rreading -: 96 MiB read (32 MiB/s)\x1b[K\r\x1b[K"
    )
    assert "\n" not in out.getvalue()


def test_json_output_is_untouched_by_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the progress line forced on, stdout is the JSON alone; the progress went to stderr."""
    monkeypatch.setattr(analyze, "ProgressLine", functools.partial(ProgressLine, delay_s=0, every_s=0))
    path = tmp_path / "dense.log"
    path.write_text("\n".join([FIRST_ERROR, *dense_lines(random.Random(2), 3000)]) + "\n")
    assert analyze.run(argparse.Namespace(path=str(path), json=True, explain=False)) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["first_error"]["lineno"] == 1
    assert f"k3repro analyze {path}: " in err and "MiB" in err
