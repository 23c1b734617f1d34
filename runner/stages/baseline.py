"""baseline: the frozen scene against the model's official compatibility baseline (a data file).

`fail` stops the run here, since a launch on an incompatible scene only reproduces the incompatibility;
`warn` (outside the recipe's hardware boundary, tag not pinned, input unknown ...) lets the run go on.
"""

from __future__ import annotations

from kernel.baseline import BaselineError, CheckStatus, load_baseline
from protos import runner_pb2 as pb
from runner.stages.context import RunContext, StageResult


async def run(ctx: RunContext) -> StageResult:
    profile = ctx.request.profile
    if not profile:
        return StageResult(pb.STAGE_STATUS_OK, "no baseline profile configured for this cluster; not checked")
    if ctx.evidence.fingerprint is None:
        return StageResult(pb.STAGE_STATUS_FAILED, "no fingerprint: freeze did not record the scene")
    try:
        baseline = load_baseline(profile, ctx.config.baseline_dirs)
    except BaselineError as exc:
        return StageResult(pb.STAGE_STATUS_FAILED, str(exc))
    report = baseline.evaluate(ctx.evidence.fingerprint)
    await ctx.artifact("baseline", report)
    by_status: dict[CheckStatus, list[str]] = {}
    for rule in report["rules"]:
        by_status.setdefault(rule["status"], []).append(rule["id"])
    if report["verdict"] == CheckStatus.FAIL:
        failed = [r for r in report["rules"] if r["status"] == CheckStatus.FAIL]
        reasons = "; ".join(f"{r['id']}: {r['message']}" for r in failed)
        return StageResult(pb.STAGE_STATUS_FAILED, f"{profile}: incompatible scene, fix it before launching: {reasons}")
    counts = ", ".join(f"{len(ids)} {status}" for status, ids in by_status.items())
    notes = [f"{status}: {', '.join(ids)}" for status, ids in by_status.items() if status != CheckStatus.PASS]
    return StageResult(
        pb.STAGE_STATUS_OK, f"{profile}: {report['verdict']} ({counts})" + (f" — {'; '.join(notes)}" if notes else "")
    )
