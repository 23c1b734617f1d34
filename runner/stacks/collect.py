"""The stacks of a stalled engine, taken before it is stopped: dumped by its backend, summarised, the raw dumps
kept as an artifact (redacted where every event is, runner/events.py) and the summary returned for the finding."""

from __future__ import annotations

import asyncio

from runner.engines import RunningEngine
from runner.stacks.summary import ProcessDump, summarize
from runner.stages.context import RunContext

# Wall seconds one process's dump may take (a few ms on an idle process; a loaded host is slower). A backend dumps
# its processes at once, so the engine's stop waits about this long; the outer limit bounds one that does not.
LIMIT_S = 5.0
OUTER_LIMIT_S = 30.0


async def stalled_stacks(ctx: RunContext, engine: RunningEngine | None, source: str) -> list[str]:
    """Dumps every process of `engine`, records the dumps as the artifact `stacks/launch-N` and returns the
    summary (the headline, then one line per process)."""
    if engine is None:
        return []
    dump = getattr(engine, "dump_stacks", None)
    if dump is None:
        dumps = [ProcessDump(0, error="this engine backend cannot list its processes", label="engine")]
    else:
        try:
            dumps = await asyncio.wait_for(dump(LIMIT_S), OUTER_LIMIT_S)
        except TimeoutError:
            dumps = [ProcessDump(0, error=f"the dumps did not finish in {OUTER_LIMIT_S:.0f} s", label="engine")]
        except OSError as exc:  # the host would not let the backend list or run anything: said, never raised
            dumps = [ProcessDump(0, error=f"the processes could not be listed: {exc}", label="engine")]
    if not dumps:  # nothing of the engine is left to dump (it exited meanwhile)
        return []
    summary = summarize(dumps)
    raw = [f"# {source}: where the engine's processes waited when it stalled (py-spy dump)", *summary, ""]
    for d in sorted(dumps, key=lambda d: d.pid):
        raw += [d.text.rstrip("\n") if d.text else f"Process {d.pid or d.label}: cannot attach: {d.error}", ""]
    await ctx.artifact(f"stacks/launch-{ctx.session.launches}", "\n".join(raw))
    return summary
