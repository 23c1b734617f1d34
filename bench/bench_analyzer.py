"""Throughput of the first-error analyzer, against references measured in the same run.

1. Corpus: lines/s of StreamAnalyzer.feed over the labelled logs, and of a plain loop that only strips
   process prefixes with the same regex (the floor any line-by-line Python analysis pays).
2. Big files (--size-mb, issue 3 asks for >= 500): serving lines of the healthy corpus logs (access
   logs, stats, requests with their prompts, warnings) repeated, with corpus logs interleaved, in three
   layouts: `interleaved` spreads all logs, healthy and failing, evenly through the file;
   `error-at-end` spreads the healthy ones and puts the failing ones at the end, so no first error is
   known until the last MiB (the scan must look for every error needle all the way); `graphs-nccl` is
   `error-at-end` with a quarter of the serving lines about CUDA graphs or NCCL (DEBUG capture lines,
   NCCL_DEBUG=INFO output), which real serving logs repeat and which share words with markers and rules
   (issue 15: such a log must stay on the fast path).
   For each: analyze_path's time (best of --repeat fresh processes, Hyperscan compilation included),
   MB/s and peak RSS at a quarter and at the full size (memory flat in the file size), and the ratio to
   `grep -c -E 'Error|Exception'` over the same file (best of --repeat). For reference, the streaming
   path (every line read, as for a pipe) on the quarter-size file.

Run: .venv/bin/python bench/bench_analyzer.py [--size-mb 512] [--repeat 3] [--corpus DIR]
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.analyzer import StreamAnalyzer, default_rules, scan  # noqa: E402

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


def child(path: Path, streaming: bool = False) -> dict[str, float]:
    """Analyze in a fresh process: its wall time and peak RSS are its own."""
    call = (
        f"analyze_lines(iter_lines(open({str(path)!r}, 'rb'), max_line_chars=default_rules().line.max_chars))"
        if streaming
        else f"analyze_path({str(path)!r})"
    )
    code = (
        "import json, resource, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from runner.analyzer import analyze_lines, analyze_path, default_rules\n"
        "from runner.analyzer.reader import iter_lines\n"
        "t = time.perf_counter()\n"
        f"a = {call}\n"
        "print(json.dumps({'s': time.perf_counter() - t, 'rss_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
        " 'lines': a.lines, 'category': a.first_error.category if a.first_error else None}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    data: dict[str, float] = json.loads(result.stdout)
    return data


def best(runs: list[dict[str, float]]) -> dict[str, float]:
    return min(runs, key=lambda r: r["s"])


def grep_s(grep: str, path: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([grep, "-c", "-E", "Error|Exception", str(path)], capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return min(times)


def bench_big(logs: dict[str, list[str]], corpus: Path, size_mb: int, repeat: int) -> None:
    grep = shutil.which("grep")
    if grep is None:
        print("no grep: big-file ratios skipped", file=sys.stderr)
        return
    for layout in ("error-at-end", "interleaved", "graphs-nccl"):
        with tempfile.TemporaryDirectory() as tmp:
            quarter = Path(tmp) / "quarter.log"
            full = Path(tmp) / "full.log"
            build_big_log(logs, corpus, quarter, max(1, size_mb // 4), layout)
            size = build_big_log(logs, corpus, full, size_mb, layout)
            small = child(quarter)
            big = best([child(full) for _ in range(repeat)])
            reference = grep_s(grep, full, repeat)
            streamed = child(quarter, streaming=True) if layout == "error-at-end" else None
        mb = size / (1 << 20)
        print(f"big file, {layout}: {mb:.0f} MiB, {big['lines']:,.0f} lines, first error category {big['category']}")
        print(f"  analyze_path      {big['s']:8.2f} s  {mb / big['s']:8.1f} MiB/s")
        print(f"  grep -c -E        {reference:8.2f} s  {mb / reference:8.1f} MiB/s")
        print(f"  ratio             {big['s'] / reference:8.1f}x grep's time")
        print(
            f"  peak RSS          {small['rss_kib'] / 1024:8.1f} MiB at {mb / 4:.0f} MiB input, "
            f"{big['rss_kib'] / 1024:.1f} MiB at {mb:.0f} MiB input"
        )
        if streamed is not None:
            print(
                f"  streaming (pipe)  {streamed['s']:8.2f} s  {mb / 4 / streamed['s']:8.1f} MiB/s at {mb / 4:.0f} MiB"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--rounds", type=int, default=5, help="passes over the corpus")
    parser.add_argument("--size-mb", type=int, default=512, help="size of the built big logs (0 skips them)")
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
    if args.size_mb:
        bench_big(logs, args.corpus, args.size_mb, args.repeat)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"bench process peak RSS {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
