"""tqdm progress bars as vLLM's start-up prints them."""

from __future__ import annotations

_BLOCKS = " ▏▎▍▌▋▊▉█"
_WIDTH = 10


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _timing(n: int, total: int, elapsed: float) -> str:
    if n == 0 or elapsed <= 0:
        return f"[{_clock(elapsed)}<?, ?it/s]"
    rate = n / elapsed
    remaining = _clock((total - n) / rate)
    speed = f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
    return f"[{_clock(elapsed)}<{remaining}, {speed}]"


def shards(desc: str, n: int, total: int, elapsed: float) -> str:
    """vLLM's own bar format for checkpoint shards: one line per update."""
    return f"{desc}: {100 * n / total:3.0f}% Completed | {n}/{total} {_timing(n, total, elapsed)}"


def graph(desc: str, n: int, total: int, elapsed: float) -> str:
    """tqdm's default bar, redrawn in place with \\r."""
    eighths = int(8 * _WIDTH * n / total)
    full, part = divmod(eighths, 8)
    bar = (_BLOCKS[-1] * full + (_BLOCKS[part] if part else "")).ljust(_WIDTH)
    return f"{desc}: {100 * n / total:3.0f}%|{bar}| {n}/{total} {_timing(n, total, elapsed)}"
