"""Where a stalled engine's processes wait: py-spy dumps read into one line per process and a headline naming the
ranks that differ from the others.

The words come from runner/data/stacks.toml (frame patterns of vLLM, torch, NCCL, transformers, safetensors,
triton, flashinfer, tokenizers, zmq); nothing here knows the backend or the simulator, so a dump of a real engine
and one of the simulator's ranks are read the same way.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from kernel.toml_reader import TomlReader, packaged

_PROCESS = re.compile(r"^Process (?P<pid>\d+): (?P<cmdline>.*)$")
_THREAD = re.compile(r'^Thread (?P<id>\S+) \((?P<state>[^)]*)\)(?::\s*"(?P<name>.*)")?\s*$')
# `    function (file:line)`; a frame py-spy could not place has no line (`function (file)`)
_FRAME = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int


@dataclass(frozen=True)
class Thread:
    name: str
    idle: bool
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them


@dataclass(frozen=True)
class ProcessDump:
    """One process's dump as py-spy printed it, or why there is none (`error`: it could not be attached to)."""

    pid: int
    text: str = ""
    error: str = ""
    label: str = ""  # how the backend names a process it could not list (a container, a Pod)


@dataclass(frozen=True)
class Wait:
    key: str  # what is compared between ranks ("all_reduce", "shm broadcast")
    says: str  # the words, with the frame ("waits in all_reduce (pynccl.py:118)")
    priority: int  # the rule's place in the data file (a wait no rule named comes last)


@dataclass(frozen=True)
class ProcessWait:
    pid: int
    role: str  # "rank 3", "engine core", "API server", or the command line's first word
    rank: int | None
    wait: Wait | None  # None: it could not be attached to (`error` says why)
    error: str = ""

    def line(self) -> str:
        where = self.wait.says if self.wait else f"cannot attach: {self.error}"
        return f"{self.role} (pid {self.pid}): {where}" if self.pid else f"{self.role}: {where}"


@dataclass(frozen=True)
class _Rule:
    id: str
    says: str
    key: str
    function: re.Pattern[str] | None
    file: re.Pattern[str] | None
    idle: bool | None


@dataclass(frozen=True)
class _Role:
    pattern: re.Pattern[str]
    name: str


@functools.cache
def _rules() -> tuple[tuple[_Role, ...], tuple[_Rule, ...]]:
    """runner/data/stacks.toml, read once; a bad row is named by file, row and key (kernel/toml_reader.py)."""
    data = packaged("stacks.toml", "runner.data")
    roles = tuple(_Role(_regex(row, "pattern"), row.text("name")) for row in data.rows("role"))
    waits = []
    for row in data.rows("wait"):
        idle = row.value("idle")
        if idle is not None and not isinstance(idle, bool):
            raise row.fail(f"'idle' must be true or false, got {idle!r}")
        rule_id = row.text("id")
        waits.append(
            _Rule(
                rule_id,
                row.text("says"),
                row.text("key", rule_id),
                _regex(row, "function") if "function" in row.data else None,
                _regex(row, "file") if "file" in row.data else None,
                idle,
            )
        )
    return roles, tuple(waits)


def _regex(row: TomlReader, key: str) -> re.Pattern[str]:
    try:
        return re.compile(row.text(key))
    except re.error as exc:
        raise row.fail(f"{key!r} is not a regular expression: {exc}") from None


def parse(text: str) -> tuple[str, list[Thread]]:
    """A py-spy dump's command line and threads."""
    cmdline, threads = "", []
    name, idle, frames = "", False, list[Frame]()
    started = False
    for raw in text.splitlines():
        if m := _PROCESS.match(raw):
            cmdline = m["cmdline"]
        elif m := _THREAD.match(raw):
            if started:
                threads.append(Thread(name, idle, tuple(frames)))
            started, name, idle, frames = True, m["name"] or m["id"], "idle" in m["state"], []
        elif started and (m := _FRAME.match(raw)):
            frames.append(Frame(m["function"], m["file"], int(m["line"] or 0)))
    if started:
        threads.append(Thread(name, idle, tuple(frames)))
    return cmdline, threads


def _matches(rule: _Rule, thread: Thread, frame: Frame) -> bool:
    short = frame.function.rsplit(".", 1)[-1]
    return (
        (rule.function is None or rule.function.search(short) is not None)
        and (rule.file is None or rule.file.search(frame.file) is not None)
        and (rule.idle is None or rule.idle == thread.idle)
    )


def _thread_wait(thread: Thread, rules: tuple[_Rule, ...]) -> Wait | None:
    """The first rule (the data file's order) that one of the thread's frames matches, at its innermost such
    frame: a zmq poll inside shm_broadcast's acquire_read is the broadcast, a tokenizer load that runs remote
    code is the remote code."""
    for priority, rule in enumerate(rules):
        for frame in thread.frames:
            if _matches(rule, thread, frame):
                fields = {
                    "function": frame.function.rsplit(".", 1)[-1],
                    "file": frame.file.rsplit("/", 1)[-1],
                    "line": frame.line,
                }
                return Wait(rule.key.format(**fields), rule.says.format(**fields), priority)
    return None


def process_wait(dump: ProcessDump) -> ProcessWait:
    """Where one process waits: the most telling of its threads' waits (the data file's order)."""
    roles, rules = _rules()
    cmdline, threads = parse(dump.text) if not dump.error else ("", [])
    role, rank = dump.label or _first_word(cmdline) or "process", None
    for candidate in roles:
        if m := candidate.pattern.search(cmdline):
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            number = next(iter(groups.values()), None)
            rank = int(number) if number is not None else None
            role = candidate.name.format(rank=number)
            break
    if dump.error:
        return ProcessWait(dump.pid, role, rank, None, dump.error)
    found = [w for t in threads if (w := _thread_wait(t, rules)) is not None]
    if found:
        return ProcessWait(dump.pid, role, rank, min(found, key=lambda w: w.priority))
    main = next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)
    if main is None or not main.frames:
        return ProcessWait(dump.pid, role, rank, Wait("no Python frames", "no Python frames", len(rules)))
    top = main.frames[0]
    state = "idle" if main.idle else "running"
    where = f"{top.function} ({top.file.rsplit('/', 1)[-1]}:{top.line})"
    return ProcessWait(dump.pid, role, rank, Wait(f"{state} in {top.function}", f"{state} in {where}", len(rules)))


def _first_word(cmdline: str) -> str:
    words = cmdline.split()
    return words[0].rsplit("/", 1)[-1] if words else ""


def ranges(numbers: list[int]) -> str:
    """`[0, 1, 2, 4, 5, 7]` → "0-2, 4-5, 7"."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def _ranks(numbers: list[int]) -> str:
    return f"rank {numbers[0]}" if len(numbers) == 1 else f"ranks {ranges(numbers)}"


def _pids(role: str, waits: list[ProcessWait]) -> str:
    pids = sorted(w.pid for w in waits)
    return f"{role} pid {pids[0]}" if len(pids) == 1 else f"{role} pids {', '.join(map(str, pids))}"


def _plural(says: str) -> str:
    """The words after a plural subject: "waits in …" → "wait in …" (ranks 0-2 wait in …)."""
    first, _, rest = says.partition(" ")
    return f"{first[:-1]} {rest}" if first.endswith("s") and not first.endswith("ss") else says


def _says(waits: list[ProcessWait]) -> str:
    said = waits[0].wait.says if waits[0].wait else ""
    return said if len(waits) == 1 else _plural(said)


def _odd_one_out(waits: list[ProcessWait], name: Callable[[list[ProcessWait]], str]) -> str:
    """ "rank 3 differs: …; ranks 0-2, 4-7 wait in …" when `waits` (processes of one kind) do not all wait alike
    (the smallest group differs; on a tie, the one with the lowest rank or pid); else ""."""
    groups: dict[str, list[ProcessWait]] = defaultdict(list)
    for w in waits:
        groups[w.wait.key if w.wait else ""].append(w)
    if len(groups) < 2:
        return ""
    odd, *rest = sorted(
        groups.values(), key=lambda g: (len(g), min(w.rank if w.rank is not None else w.pid for w in g))
    )
    verb = "differs" if len(odd) == 1 else "differ"
    return f"{name(odd)} {verb}: {_says(odd)}; " + "; ".join(f"{name(g)} {_says(g)}" for g in rest)


def headline(waits: list[ProcessWait]) -> str:
    """One line: the ranks (or, before vLLM titles its workers with their rank, the processes of one kind) that
    differ from the others and where, else where the engine's processes wait (the most telling first)."""
    waiting = [w for w in waits if w.wait is not None]
    ranked = [w for w in waiting if w.rank is not None]
    if odd := _odd_one_out(ranked, lambda g: _ranks(sorted(w.rank for w in g if w.rank is not None))):
        return odd
    by_role: dict[str, list[ProcessWait]] = defaultdict(list)
    for w in waiting:
        if w.rank is None:
            by_role[w.role].append(w)
    for role, members in by_role.items():
        if odd := _odd_one_out(members, functools.partial(_pids, role)):
            return odd
    telling = sorted((w for w in waiting if w.rank is None), key=lambda w: w.wait.priority if w.wait else 0)
    parts = [f"{_ranks(sorted(w.rank for w in ranked if w.rank is not None))} {_says(ranked)}"] if ranked else []
    parts += [f"{w.role}: {w.wait.says}" for w in telling[:2] if w.wait is not None]
    return "; ".join(parts or [w.line() for w in waits[:2]])


def summarize(dumps: list[ProcessDump]) -> list[str]:
    """The headline, then one line per process (in pid order; those that could not be attached to say why)."""
    waits = [process_wait(d) for d in sorted(dumps, key=lambda d: d.pid)]
    if not waits:
        return []
    return [headline(waits), *(w.line() for w in waits)]
