"""Throughput of the first-error analyzer, against references measured in the same run.

1. Corpus: lines/s of StreamAnalyzer.feed over the 48 labelled logs, and of a plain loop that only strips
   process prefixes with the same regex (the floor any line-by-line Python analysis pays).
2. Big file (--size-mb, issue 3 asks for >= 500): a log built from a healthy corpus start-up, its serving
   lines repeated, and a failing log at the end; analyze_path's MB/s and peak memory (in a child
   process, at a quarter and at the full size, to show memory stays flat), and the time ratio to
   `grep -c -E 'Error|Exception'` over the same file.

Run: .venv/bin/python bench/bench_analyzer.py [--size-mb 512] [--corpus DIR]
"""

from __future__ import annotations

import argparse
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

from runner.analyzer import StreamAnalyzer, default_rules  # noqa: E402

DEFAULT_CORPUS = Path(os.environ.get("K3REPRO_CORPUS", REPO.parent / "shared" / "corpus"))


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


def build_big_log(logs: dict[str, list[str]], corpus: Path, path: Path, size_mb: int) -> int:
    """Healthy start-ups, their serving lines repeated up to size_mb, then every failing log (so the
    analysis reads everything before it finds the first error)."""
    healthy, failing = healthy_and_failing(corpus)
    head = [line for name in healthy for line in logs[name]]
    serving: list[str] = []
    for name in healthy:
        lines = logs[name]
        marks = [i for i, line in enumerate(lines) if "Application startup complete" in line]
        serving += lines[marks[0] + 1 :] if marks else []
    block = ("\n".join(serving) + "\n").encode()
    tail = ("\n".join(line for name in failing for line in logs[name]) + "\n").encode()
    target = size_mb << 20
    with path.open("wb") as out:
        out.write(("\n".join(head) + "\n").encode())
        while out.tell() < target:
            out.write(block)
        out.write(tail)
        return out.tell()


def child_analysis(path: Path) -> dict[str, float]:
    """Run analyze_path in a fresh process: its wall time and peak RSS are its own."""
    code = (
        "import json, resource, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from runner.analyzer import analyze_path\n"
        "t = time.perf_counter()\n"
        f"a = analyze_path({str(path)!r})\n"
        "print(json.dumps({'s': time.perf_counter() - t, 'rss_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
        " 'lines': a.lines, 'category': a.first_error.category if a.first_error else None}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    data: dict[str, float] = json.loads(result.stdout)
    return data


def bench_big(logs: dict[str, list[str]], corpus: Path, size_mb: int) -> None:
    grep = shutil.which("grep")
    with tempfile.TemporaryDirectory() as tmp:
        quarter = Path(tmp) / "quarter.log"
        full = Path(tmp) / "full.log"
        build_big_log(logs, corpus, quarter, max(1, size_mb // 4))
        size = build_big_log(logs, corpus, full, size_mb)
        small = child_analysis(quarter)
        big = child_analysis(full)
        grep_s = float("nan")
        if grep:
            start = time.perf_counter()
            subprocess.run([grep, "-c", "-E", "Error|Exception", str(full)], capture_output=True, check=False)
            grep_s = time.perf_counter() - start
    mb = size / (1 << 20)
    print(f"big file: {mb:.0f} MiB, {big['lines']:,.0f} lines, first error category {big['category']}")
    print(
        f"  analyze_path      {big['s']:8.2f} s  {mb / big['s']:8.1f} MiB/s  {big['lines'] / big['s']:12,.0f} lines/s"
    )
    print(f"  grep -c -E        {grep_s:8.2f} s  {mb / grep_s:8.1f} MiB/s")
    print(f"  ratio             {big['s'] / grep_s:8.1f}x grep's time")
    print(
        f"  peak RSS          {small['rss_kib'] / 1024:8.1f} MiB at {mb / 4:.0f} MiB input, "
        f"{big['rss_kib'] / 1024:.1f} MiB at {mb:.0f} MiB input"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--rounds", type=int, default=5, help="passes over the corpus")
    parser.add_argument("--size-mb", type=int, default=64, help="size of the built big log (0 skips it)")
    args = parser.parse_args()
    logs = corpus_logs(args.corpus)
    if not logs:
        print(f"no corpus logs under {args.corpus}/logs", file=sys.stderr)
        return 2
    print(f"python {sys.version.split()[0]}")
    bench_corpus(logs, args.rounds)
    if args.size_mb:
        bench_big(logs, args.corpus, args.size_mb)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"bench process peak RSS {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
