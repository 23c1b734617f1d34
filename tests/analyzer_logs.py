"""Generated big logs for the analyzer's speed and equivalence (bench/bench_analyzer.py, test_analyzer_scan):
serving noise without error words, and error-dense noise: a third of the lines say ERROR, Error or Exception
the way other components and apps do, and none is a vLLM error, so the analyzer must keep looking to the end."""

from __future__ import annotations

import random
from pathlib import Path

# Serving lines of a vLLM server, without error words.
QUIET = [
    "(APIServer pid=7) INFO 03-01 12:{m:02d}:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: {f:.1f} "
    "tokens/s, Avg generation throughput: {g:.1f} tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache usage: "
    "{p:.1f}%, Prefix cache hit rate: {q:.1f}%",
    '(APIServer pid=7) INFO:     10.1.{r}.{n}:{i} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "(APIServer pid=7) INFO 03-01 12:{m:02d}:{s:02d} [logger.py:39] Received request chatcmpl-{h}: prompt: "
    "'<|im_start|>user\\nsummarise the ticket {i} for the on-call channel<|im_end|>', params: "
    "SamplingParams(n=1, temperature={t:.1f}, top_p=0.95, max_tokens={i})",
    "(APIServer pid=7) INFO 03-01 12:{m:02d}:{s:02d} [async_llm.py:261] Added request chatcmpl-{h}.",
    "(APIServer pid=7) INFO 03-01 12:{m:02d}:{s:02d} [async_llm.py:420] Finished request chatcmpl-{h}.",
    '(APIServer pid=7) INFO:     127.0.0.1:{i} - "GET /metrics HTTP/1.1" 200 OK',
]
# Lines with ERROR, Error or Exception that are no vLLM error: other components' and apps' error records,
# INFO lines quoting exception names, paths and metric names with the words.
DENSE = [
    "ERROR 03-01 12:{m:02d}:{s:02d} [auth_client.py:88] token refresh failed for tenant {i}: upstream returned 503",
    "2026-03-01 12:{m:02d}:{s:02d},{ms:03d} - payments.db - ERROR - connection reset by peer, retrying ({r}/5)",
    "[2026-03-01 12:{m:02d}:{s:02d}.{ms:03d}] ERROR scheduler.go:221: job {i} failed: context deadline exceeded",
    "12:{m:02d}:{s:02d}.{ms:03d} [main] ERROR c.e.OrderService - order {i} rejected by the fraud check",
    "INFO 03-01 12:{m:02d}:{s:02d} [retry.py:40] caught TimeoutException from the upstream, retry {r}/5",
    'INFO:     10.0.{r}.7:{i} - "GET /static/ErrorPage.html HTTP/1.1" 404 Not Found',
    "WARNING 03-01 12:{m:02d}:{s:02d} [poller.py:12] ConnectionError while polling the metrics endpoint, next try "
    "in {i} ms",
    "(APIServer pid=7) INFO 03-01 12:{m:02d}:{s:02d} [serving_chat.py:300] request chatcmpl-{h} streamed to the "
    "client; ErrorResponse not needed",
    '2026-03-01T12:{m:02d}:{s:02d}Z level=error msg="ERROR sending span batch" exporter=otlp attempt={r}',
    "INFO 03-01 12:{m:02d}:{s:02d} [slo.py:88] ErrorRate(5m)={p:.2f} ExceptionCount={r} budget left {q:.1f}%",
    "DEBUG 03-01 12:{m:02d}:{s:02d} [cache.py:61] miss for key tenant:{i}:ErrorBudget",
    '10.2.{r}.9 - - [01/Mar/2026:12:{m:02d}:{s:02d} +0000] "GET /api/v2/Exceptions?page={r} HTTP/1.1" 200 {i}',
    "E0301 12:{m:02d}:{s:02d}.{ms:03d}000       1 reflector.go:138] failed to list pods: ERROR connection refused",
    "INFO 03-01 12:{m:02d}:{s:02d} [router.py:51] route /debug/ErrorInjection disabled for tenant {i}",
    "CRITICAL 03-01 12:{m:02d}:{s:02d} [watchdog.py:20] disk usage at 9{r}% on /var/log/tenant-{i}",
    "INFO 03-01 12:{m:02d}:{s:02d} [retry.py:77] attempt {r} failed with ConnectionResetError: peer closed the "
    "stream, retrying",
]
# Early in an error-dense log: an error record with no traceback, which a later, stronger error would beat.
FIRST_ERROR = "ERROR 03-01 12:00:00 [sidecar.py:10] health probe of the cache sidecar failed: status 500"


def _fill(rng: random.Random, template: str) -> str:
    return template.format(
        m=rng.randrange(60),
        s=rng.randrange(60),
        ms=rng.randrange(1000),
        i=rng.randrange(1000, 65000),
        n=rng.randrange(256),
        r=rng.randrange(1, 9),
        f=rng.uniform(0, 4000),
        g=rng.uniform(0, 900),
        p=rng.uniform(0, 100),
        q=rng.uniform(0, 100),
        t=rng.uniform(0, 1),
        h=f"{rng.getrandbits(64):016x}",
    )


def noise_lines(rng: random.Random, count: int) -> list[str]:
    """Serving lines without error words."""
    return [_fill(rng, rng.choice(QUIET)) for _ in range(count)]


def dense_lines(rng: random.Random, count: int) -> list[str]:
    """Every third line from DENSE, the others serving lines."""
    return [_fill(rng, rng.choice(DENSE if i % 3 == 0 else QUIET)) for i in range(count)]


def write_log(path: Path, size: int, kind: str, seed: int = 0) -> int:
    """A log of about `size` bytes: `noise` or `dense` (FIRST_ERROR first); a block of lines repeated."""
    rng = random.Random(seed)
    lines = noise_lines(rng, 20_000) if kind == "noise" else dense_lines(rng, 20_000)
    block = ("\n".join(lines) + "\n").encode()
    with path.open("wb") as out:
        if kind == "dense":
            out.write(FIRST_ERROR.encode() + b"\n")
        while out.tell() < size:
            out.write(block)
        return out.tell()
