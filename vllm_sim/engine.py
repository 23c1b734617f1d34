"""The simulated engine core: scheduling, prefill and decode on the simulated clock, and its statistics.

Requests queue for one of --max-num-seqs slots, are counted by the prefix cache when first scheduled
(vLLM's rule), then prefill and decode at the scenario's rates. A request-phase fault kills the engine
the way vLLM's does: the failure is logged, every request in flight fails, and the engine stays dead.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from vllm_sim.catalog import Catalog
from vllm_sim.clock import SimClock
from vllm_sim.conditions import RequestView
from vllm_sim.datafiles import load
from vllm_sim.failure import hang, write_failure
from vllm_sim.logwriter import LogWriter, Procs
from vllm_sim.prefix_cache import PrefixCache
from vllm_sim.scenario import Fault
from vllm_sim.sizing import Facts
from vllm_sim.tokenizer import reply, tokenize

_EOS = ""  # the end-of-sequence token: counted as generated, never shown
_HIT_RATE_WINDOW = 1000  # requests in the logged prefix-cache hit rate (vLLM's CachingMetrics)
# Wall seconds a request waits at admission, in a scenario with a fault that needs several requests in flight, before
# the fault looks: a real engine schedules the requests a client sent together in one step, but at `speed` times the
# wall clock the simulator would finish one before the client's next arrives on a loaded machine. Other scenarios
# never wait.
_BATCH_WINDOW_S = 0.2


class EngineDeadError(Exception):
    """The engine core died; the API server answers 500 until it exits."""


class FaultResponseError(Exception):
    """A fault answered this request with an error; the server goes on serving."""


@dataclass(frozen=True)
class Generation:
    prompt: list[str]
    output: list[str]  # ends with _EOS when the model stopped by itself
    finish_reason: str  # "stop" | "length"
    tools: bool = False  # the request offers tools


class Engine:
    def __init__(self, facts: Facts, catalog: Catalog, log: LogWriter, procs: Procs, clock: SimClock) -> None:
        self._facts = facts
        self._catalog = catalog
        self._log = log
        self._procs = procs
        self._clock = clock
        self._timings = facts.scenario.timings
        self._words = tokenize(facts.scenario.model.reply_text)
        self._slots = asyncio.Semaphore(facts.max_num_seqs)
        self._active: dict[int, int] = {}  # request -> tokens it holds in the KV cache
        self._window: deque[tuple[int, int]] = deque(maxlen=_HIT_RATE_WINDOW)
        self.cache = PrefixCache(
            enabled=facts.settings.enable_prefix_caching,
            block_size=facts.settings.block_size,
            capacity_blocks=facts.num_gpu_blocks,
        )
        self._first_blocks: set[tuple[str, ...]] = set()  # first KV block of every request seen
        self._draws: Counter[str] = Counter()  # matching requests per fault, for probability draws
        self._batches = any(f.phase == "request" and f.when.concurrency_min for f in facts.scenario.faults)
        self._stuck = asyncio.Event()
        self.dead = asyncio.Event()
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.request_success: Counter[str] = Counter()

    @property
    def running(self) -> int:
        return len(self._active)

    def kv_cache_usage(self) -> float:
        used = sum(math.ceil(tokens / self.cache.block_size) for tokens in self._active.values())
        return used / self._facts.num_gpu_blocks if self._facts.num_gpu_blocks else 0.0

    def plan(self, prompt: list[str], max_tokens: int, *, tools: bool = False) -> Generation:
        """What the model answers: the same prompt always gets the same reply, cut at max_tokens."""
        natural = self._facts.scenario.model.reply_tokens
        words = [*reply(prompt, self._words, natural - 1), _EOS]
        if max_tokens >= natural:
            return Generation(prompt, words, "stop", tools)
        return Generation(prompt, words[:max_tokens], "length", tools)

    async def run(self, generation: Generation) -> AsyncIterator[str]:
        """Schedules and runs a request, yielding its text tokens as they are decoded."""
        self._check_alive()
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        key = id(generation)
        try:
            self._check_alive()
            if self._stuck.is_set():  # a hung engine schedules nothing more
                await hang([], self._log, self._procs)
            self._active[key] = len(generation.prompt)
            if self._batches:
                await asyncio.sleep(_BATCH_WINDOW_S)  # wall time: see _BATCH_WINDOW_S
            fault = self._request_fault(self._view(generation))
            if fault is not None:
                await self._strike(fault)
            cached = self.cache.schedule(generation.prompt)
            self._window.append((len(generation.prompt), cached))
            await self._clock.sleep((len(generation.prompt) - cached) / self._timings.prefill_tokens_per_s)
            self.prompt_tokens += len(generation.prompt)
            for token in generation.output:
                await self._clock.sleep(1 / self._timings.decode_tokens_per_s)
                self._check_alive()
                self._active[key] += 1
                self.generation_tokens += 1
                if token != _EOS:
                    yield token
            self.request_success[generation.finish_reason] += 1
            self.cache.store([*generation.prompt, *generation.output])
        finally:
            self._active.pop(key, None)
            self._slots.release()

    def _check_alive(self) -> None:
        if self.dead.is_set():
            raise EngineDeadError

    def _view(self, generation: Generation) -> RequestView:
        """The request as request-phase conditions see it; remembers its first KV block."""
        first = tuple(generation.prompt[: self.cache.block_size])
        repeated = len(first) == self.cache.block_size and first in self._first_blocks
        if len(first) == self.cache.block_size:
            self._first_blocks.add(first)
        return RequestView(len(generation.prompt), repeated, generation.tools, len(self._active) + self.waiting)

    def _request_fault(self, request: RequestView) -> Fault | None:
        conditions, scenario = self._facts.conditions(), self._facts.scenario
        for fault in scenario.faults:
            if (
                fault.phase == "request"
                and self._catalog.spec(fault.error, fault.phase).only <= conditions
                and fault.when.launch_matches(self._facts.settings.command, scenario.host)
                and fault.when.request_matches(request)
            ):
                self._draws[fault.id] += 1
                if fault.strikes(scenario.host.seed, self._facts.launch, self._draws[fault.id]):
                    return fault
        return None

    async def _strike(self, fault: Fault) -> None:
        """The fault's effect on the engine: it dies, it answers this request with an error, or it hangs."""
        multiproc, spec = self._facts.multiproc, self._catalog.spec(fault.error, fault.phase)
        rank = fault.rank if multiproc else 0
        blocks = self._catalog.blocks(spec, rank, multiproc, self._facts.values(), traceback=fault.traceback)
        if fault.effect == "error_response":
            exception = blocks[0].exception if blocks else ()
            if exception:
                logged = self._catalog.response_error("\n".join(exception), fault.traceback)
                await write_failure([logged], self._log, self._procs, self._clock)
            raise FaultResponseError(exception[0] if exception else "Internal Server Error")
        if fault.effect == "hang":
            self._stuck.set()
            await hang([] if spec.key else blocks, self._log, self._procs, fault.waits, rank)
        self.dead.set()
        await write_failure(blocks, self._log, self._procs, self._clock)
        raise EngineDeadError

    async def log_stats(self) -> None:
        """vLLM's periodic `Engine 000: ...` line, written while there is (or just was) traffic."""
        stats = load("log.toml")["stats"]
        interval = self._timings.stats_interval
        last_prompt, last_generation, was_busy = 0, 0, False
        while True:
            await self._clock.sleep(interval)
            prompt_rate = (self.prompt_tokens - last_prompt) / interval
            generation_rate = (self.generation_tokens - last_generation) / interval
            last_prompt, last_generation = self.prompt_tokens, self.generation_tokens
            busy = bool(prompt_rate or generation_rate or self.running or self.waiting)
            if busy or was_busy:
                queries = sum(q for q, _ in self._window)
                self._log.log(
                    self._procs.api,
                    "INFO",
                    stats["file"],
                    stats["text"].format(
                        prompt_throughput=prompt_rate,
                        generation_throughput=generation_rate,
                        running=self.running,
                        waiting=self.waiting,
                        kv_usage_pct=100 * self.kv_cache_usage(),
                        hit_rate_pct=100 * sum(h for _, h in self._window) / queries if queries else 0.0,
                    ),
                )
            was_busy = busy
