"""One clock per side: production code reads the time only through kernel/clock.py (`WallClock`, `Clock`).

A direct `time.time()` or `datetime.now()` elsewhere is a "now" a test cannot fake and a second definition of
the side's clock; this reads the sources with `ast` and names each such call by file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import cast

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import BotConfig, ClusterConfig
from bot.slack.access import GROUP_TTL_S, Access
from kernel.clock import WallClock

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "runner", "kernel", "protos")
ALLOWED = {Path("kernel/clock.py")}
TIME_READS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}
DATE_READS = {"now", "utcnow", "today"}


def clock_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for each read of the system's time in `source`: `time.X()`, `datetime.X()` (through any
    module path or alias, `dt.datetime.now()` included) and a name imported from `time` or `datetime` that reads it."""
    tree = ast.parse(source)
    imported: dict[str, str] = {}  # a local name -> "time.monotonic", "datetime.datetime", "datetime", "time"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime"):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, imported)
        module, _, attr = name.rpartition(".")
        if (module == "time" and attr in TIME_READS) or (
            module in ("datetime.datetime", "datetime.date") and attr in DATE_READS
        ):
            found.append((node.lineno, name))
    return sorted(found)


def _dotted(node: ast.expr, imported: dict[str, str]) -> str:
    """`a.b.c` with its first name resolved through the module's imports; "" for anything else."""
    if isinstance(node, ast.Name):
        return imported.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, imported)
        return f"{base}.{node.attr}" if base else ""
    return ""


def test_no_production_module_reads_the_time_but_kernel_clock() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}()"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in ALLOWED
        for line, name in clock_reads(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, "read the time through kernel.clock (WALL or an injected WallClock):\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        "import time\ntime.monotonic()",
        "import time as t\nt.time()",
        "from time import perf_counter\nperf_counter()",
        "from datetime import UTC, datetime\ndatetime.now(UTC)",
        "import datetime as dt\ndt.datetime.now(dt.UTC)",
        "import datetime\ndatetime.datetime.utcnow()",
        "from datetime import date\ndate.today()",
    ],
)
def test_each_way_of_reading_the_time_is_caught(source: str) -> None:
    assert [line for line, _ in clock_reads(source)] == [2]


def test_time_not_read_is_not_caught() -> None:
    source = "import time\nfrom datetime import datetime\ntime.sleep(1)\ndatetime.fromisoformat('2026-01-01')\nx.now()"
    assert clock_reads(source) == []


def test_wall_clock_derives_every_reading_from_now() -> None:
    class Fixed(WallClock):
        def now(self) -> float:
            return 86400.5

    assert Fixed().stamp() == "1970-01-02T00:00:00.500+00:00"
    assert Fixed().stamp("seconds") == "1970-01-02T00:00:00+00:00"


class FakeClock(WallClock):
    """Time that moves only when the test moves it (or a component sleeps on it)."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


async def test_a_component_reads_the_clock_it_is_given() -> None:
    """Access trusts a user group's members for GROUP_TTL_S of its clock, then asks Slack again."""
    asked: list[str] = []

    class Client:
        async def usergroups_users_list(self, usergroup: str) -> dict[str, list[str]]:
            asked.append(usergroup)
            return {"users": ["U1"]}

    clock = FakeClock()
    cluster = ClusterConfig("c", (), "", (), operators=("S1",))
    access = Access(BotConfig(Path("store.db"), {"c": cluster}), cast(AsyncWebClient, Client()), clock)
    await access.check_operator(cluster, "U1")
    clock.t += GROUP_TTL_S - 1
    await access.check_operator(cluster, "U1")
    assert asked == ["S1"]
    clock.t += 1
    await access.check_operator(cluster, "U1")
    assert asked == ["S1", "S1"]
