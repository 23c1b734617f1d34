"""Throughput of the first-error analyzer, against references measured in the same run.

1. Corpus: lines/s of StreamAnalyzer.feed over the labelled logs, and of a plain loop that only strips
   process prefixes with the same regex (the floor any line-by-line Python analysis pays).
2. Big files (--size-mb, default 256; issue 3 asked for >= 500 once), one per log class:
   - `noise`: generated serving lines without error words (tests/analyzer_logs.py);
   - `error-dense`: a third of the lines say ERROR, Error or Exception as other components and apps do (error
     records of other loggers, INFO lines quoting exception names, paths and metrics with the words), none a
     vLLM error, and a logged ERROR line first: the analyzer must keep looking for a stronger error to the end;
   - real vLLM lines: serving lines of the healthy corpus logs with corpus logs interleaved, in three layouts:
     `interleaved` spreads all logs, healthy and failing, evenly through the file; `error-at-end` spreads the
     healthy ones and puts the failing ones at the end, so no first error is known until the last MiB;
     `graphs-nccl` is `error-at-end` with a quarter of the serving lines about CUDA graphs or NCCL (DEBUG
     capture lines, NCCL_DEBUG=INFO output), which share words with markers and rules (issue 15).
   For each: the file path (analyze_path) and the pipe path (`cat FILE | ...analyze_stream(stdin)`, as
   `k3repro analyze -` reads), each the best of --repeat fresh processes (the rules loaded in each; the
   Hyperscan databases loaded from the on-disk cache, $XDG_CACHE_HOME/k3repro, as on every run but the first
   with new rules), MiB/s, peak RSS, and the ratio to `grep -c -E 'Error|Exception' FILE` (best of --repeat) in
   the same run; and once the file path with an empty cache (`cold`: every database compiled, a user's first
   run). Both paths must give the same analysis (checked).

Run: .venv/bin/python bench/bench_analyzer.py [--size-mb 256] [--repeat 3] [--corpus DIR] [--classes a,b]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernel.analyzer import StreamAnalyzer, default_rules, scan  # noqa: E402
from tests.analyzer_logs import write_log  # noqa: E402

DEFAULT_CORPUS = Path(os.environ.get("K3REPRO_CORPUS", REPO / "tests" / "corpus"))


def corpus_logs(corpus: Path) -> dict[str, list[str]]:
    logs = {}
    for path in sorted((corpus / "logs").glob("*.log")):
        lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
        logs[path.name] = lines[:-1] if lines[-1] == "" else lines
    return logs


def bench_corpus(logs: dict[str, list[str]], rounds: int) -> None:
    total = sum(len(lines) for lines in logs.values()) * rounds
    start = time.perf_counter()
    for _ in range(rounds):
        for lines in logs.values():
            analyzer = StreamAnalyzer()
            for line in lines:
                analyzer.feed(line, 0.0)
            analyzer.close()
    analyzer_s = time.perf_counter() - start
    prefix = default_rules().line.process
    start = time.perf_counter()
    for _ in range(rounds):
        for lines in logs.values():
            for line in lines:
                end = 0
                while match := prefix.match(line, end):
                    end = match.end()
                line[end:]
    reference_s = time.perf_counter() - start
    print(f"corpus: {len(logs)} logs x {rounds} rounds = {total} lines")
    print(f"  stream analyzer   {total / analyzer_s:12,.0f} lines/s")
    print(f"  prefix-strip loop {total / reference_s:12,.0f} lines/s")
    print(f"  ratio             {analyzer_s / reference_s:12.1f}x the prefix-strip loop's time")


def healthy_and_failing(corpus: Path) -> tuple[list[str], list[str]]:
    labels = [json.loads(line) for line in (corpus / "labels.jsonl").read_text(encoding="utf-8").splitlines() if line]
    healthy = [label["file"] for label in labels if label["phase"] is None]
    failing = [label["file"] for label in labels if label["phase"] is not None]
    return healthy, failing


# Serving-time lines about CUDA graphs and NCCL, one of them after every three other serving lines.
GRAPHS_NCCL = [
    "(EngineCore_DP0 pid=1833) DEBUG 07-06 09:41:07 [cuda_graph.py:180] Capturing a cudagraph on (PIECEWISE, "
    "BatchDescriptor(num_tokens=24, uniform_decode=False))",
    "gpu-node-3:1833:2107 [0] NCCL INFO Channel 02/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "(Worker_TP1 pid=1902) INFO 07-06 09:41:07 [custom_all_reduce.py:216] Registering 8 cuda graph addresses",
    "gpu-node-3:1902:2110 [1] NCCL INFO comm 0x55d1 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 - Init COMPLETE",
]


def build_big_log(logs: dict[str, list[str]], corpus: Path, path: Path, size_mb: int, layout: str) -> int:
    """Serving noise up to size_mb with corpus logs interleaved (see the module docstring)."""
    healthy, failing = healthy_and_failing(corpus)
    serving: list[str] = []
    for name in healthy:
        lines = logs[name]
        marks = [i for i, line in enumerate(lines) if "Application startup complete" in line]
        serving += lines[marks[0] + 1 :] if marks else []
    if layout == "graphs-nccl":
        serving = [line for i in range(0, len(serving), 3) for line in (*serving[i : i + 3], GRAPHS_NCCL[i % 4])]
    block = ("\n".join(serving) + "\n").encode()
    spread = sorted(logs) if layout == "interleaved" else healthy
    inserts = [("\n".join(logs[name]) + "\n").encode() for name in spread]
    tail = b"" if layout == "interleaved" else ("\n".join(line for n in failing for line in logs[n]) + "\n").encode()
    target = size_mb << 20
    step = target // len(inserts)
    with path.open("wb") as out:
        for i, log in enumerate(inserts):
            out.write(log)
            while out.tell() < (i + 1) * step:
                out.write(block)
        out.write(tail)
        return out.tell()


CLASSES = ("noise", "error-dense", "error-at-end", "interleaved", "graphs-nccl")


def build(logs: dict[str, list[str]], corpus: Path, path: Path, size_mb: int, kind: str) -> int:
    if kind in ("noise", "error-dense"):
        return write_log(path, size_mb << 20, "noise" if kind == "noise" else "dense")
    return build_big_log(logs, corpus, path, size_mb, kind)


_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from kernel.analyzer import analyze_path, analyze_stream
t = time.perf_counter()
a = analyze_stream(sys.stdin.buffer) if {pipe!r} else analyze_path({path!r})
s = time.perf_counter() - t
print(json.dumps({{"s": s, "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "lines": a.lines,
                   "result": [a.to_json(explain=True), a.first_error.context if a.first_error else None]}}))
"""


def child(path: Path, pipe: bool, cache: Path | None = None) -> dict[str, Any]:
    """Analyze in a fresh process, from the file or from `cat FILE |`: its wall time and peak RSS are its own.
    `cache`: the databases' cache folder to use instead of the user's (an empty one: all are compiled)."""
    code = _CHILD.format(repo=str(REPO), pipe=pipe, path=str(path))
    env = None if cache is None else {**os.environ, "XDG_CACHE_HOME": str(cache)}
    if not pipe:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        data: dict[str, Any] = json.loads(result.stdout)
        return data
    with subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE) as cat:
        result = subprocess.run(
            [sys.executable, "-c", code], stdin=cat.stdout, capture_output=True, text=True, check=True
        )
    data = json.loads(result.stdout)
    return data


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return min(runs, key=lambda r: r["s"])


def grep_s(grep: str, path: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([grep, "-c", "-E", "Error|Exception", str(path)], capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return min(times)


def bench_big(logs: dict[str, list[str]], corpus: Path, size_mb: int, repeat: int, classes: list[str]) -> bool:
    """The table; False when a class is under 100 MiB/s on a path or the two paths disagree."""
    grep = shutil.which("grep")
    if grep is None or shutil.which("cat") is None:
        print("no grep or cat: big-file ratios skipped", file=sys.stderr)
        return True
    ok = True
    print(f"load average before the big files {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    print(
        f"{'class':<13} {'MiB':>5} {'lines':>10} | {'file s':>7} {'MiB/s':>6} {'x grep':>6} | "
        f"{'pipe s':>7} {'MiB/s':>6} {'x grep':>6} | {'grep s':>6} {'MiB/s':>6} | {'cold s':>6} | "
        f"RSS file/pipe MiB | first error"
    )
    for kind in classes:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{kind}.log"
            mb = build(logs, corpus, path, size_mb, kind) / (1 << 20)
            file = best([child(path, pipe=False) for _ in range(repeat)])
            pipe = best([child(path, pipe=True) for _ in range(repeat)])
            reference = grep_s(grep, path, repeat)
            cold = child(path, pipe=False, cache=Path(tmp) / "cache")
        same = all(run["result"] == file["result"] and run["lines"] == file["lines"] for run in (pipe, cold))
        found = file["result"][0]
        error = found["first_error"]
        what = f"line {error['lineno']:,} {found['category']}" if error else "none"
        ok &= same and min(mb / file["s"], mb / pipe["s"]) >= 100
        print(
            f"{kind:<13} {mb:5.0f} {file['lines']:10,} | {file['s']:7.2f} {mb / file['s']:6.0f} "
            f"{file['s'] / reference:6.1f} | {pipe['s']:7.2f} {mb / pipe['s']:6.0f} {pipe['s'] / reference:6.1f} | "
            f"{reference:6.2f} {mb / reference:6.0f} | {cold['s']:6.2f} | "
            f"{file['rss_kib'] / 1024:5.0f} / {pipe['rss_kib'] / 1024:5.0f}"
            f"       | {what}{'' if same else '  RESULTS DIFFER'}"
        )
    print(f"load average after {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--rounds", type=int, default=5, help="passes over the corpus")
    parser.add_argument("--size-mb", type=int, default=256, help="size of the built big logs (0 skips them)")
    parser.add_argument("--classes", default=",".join(CLASSES), help=f"log classes, of {', '.join(CLASSES)}")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each timed command; the best counts")
    args = parser.parse_args()
    logs = corpus_logs(args.corpus)
    if not logs:
        print(f"no corpus logs under {args.corpus}/logs", file=sys.stderr)
        return 2
    print(f"python {sys.version.split()[0]}")
    fast = scan.usable(io.BytesIO(), default_rules())
    print(f"whole-file analysis: {'Hyperscan scan' if fast else 'no Hyperscan, every line is read'}")
    bench_corpus(logs, args.rounds)
    ok = True
    if args.size_mb:
        ok = bench_big(logs, args.corpus, args.size_mb, args.repeat, args.classes.split(","))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"bench process peak RSS {peak:.0f} MiB")
    if not ok:
        print("FAIL: a class under 100 MiB/s on a path, or the paths' analyses differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
