"""freeze: the read-only record of the failure scene, taken before anything is launched."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kernel import images
from kernel.fingerprint.document import seal
from protos import runner_pb2 as pb
from protos.vocab import DEFAULT_REPEATS, to_id
from runner.fingerprint import Change, FixedRequest, collect
from runner.stages.context import RunContext, StageResult
from runner.stages.probes import api, fixed_body

HOLDS, PENDING = pb.CHECKLIST_STATE_HOLDS, pb.CHECKLIST_STATE_PENDING


async def run(ctx: RunContext) -> StageResult:
    argv = ctx.command.argv()
    target = ctx.backend.probe_target(argv, ctx.request.image)
    changes = [Change(c.at, c.what, c.by) for c in ctx.request.changes]
    failed = _deployment_error(ctx.request)
    body = json.dumps(fixed_body(ctx), sort_keys=True)  # what the run sends, as it sends it
    request = FixedRequest(
        api(ctx), body, ctx.request.request.repeats or DEFAULT_REPEATS, hashed=ctx.config.request_bodies == "hash"
    )
    scene = pin(
        await asyncio.to_thread(
            collect, ctx.backend.nvml, target, argv=argv, changes=changes, deployment_error=failed, request=request
        )
    )
    pinned_ref = (scene["image"] or {}).get("pinned_ref")
    if pinned_ref and ctx.request.image:
        # Every launch of this run reads the image from the request: by the digest, a moved tag cannot change
        # what runs mid-run, and the bundle's rerun runs the same digest.
        ctx.request.image = pinned_ref
    ctx.evidence.fingerprint = scene
    await ctx.artifact("fingerprint", scene)
    for name, content in (await asyncio.to_thread(ctx.backend.scene_files)).items():
        await ctx.artifact(name, content)
    nvml, runtime = scene["nvml"], scene["runtime"]
    if nvml["available"] and nvml["driver_version"]:
        ctx.evidence.drivers.append(nvml["driver_version"])
    if scene["image"] and scene["image"].get("id"):
        ctx.evidence.images.append(scene["image"]["id"])
    if nvml["available"]:
        driver = f"driver {nvml['driver_version']} (CUDA {nvml['cuda_driver_version']}), {nvml['gpu_count']} GPU(s)"
        await ctx.check(pb.CHECKLIST_ID_HOST_DRIVER_RECORDED, HOLDS, driver)
    else:
        driver = f"NVML unavailable ({nvml['error']})"
        await ctx.check(pb.CHECKLIST_ID_HOST_DRIVER_RECORDED, PENDING, nvml["error"] or "")
    smi = runtime["container_nvidia_smi"] or {}
    if smi.get("available"):
        view = f"nvidia-smi ({runtime['source']}): driver {smi['driver_version']}, {smi['gpu_count']} GPU(s)"
        await ctx.check(pb.CHECKLIST_ID_CONTAINER_GPU_VIEW_RECORDED, HOLDS, view)
    else:
        reason = smi.get("error") or runtime["error"] or "nvidia-smi did not run"
        await ctx.check(pb.CHECKLIST_ID_CONTAINER_GPU_VIEW_RECORDED, PENDING, f"no GPU view: {reason}")
    pinned, evidence = _pinned(scene)
    await ctx.check(pb.CHECKLIST_ID_IMAGE_AND_VERSIONS_PINNED, HOLDS if pinned else PENDING, evidence)
    host = scene["host"]
    deployment = f" · the deployment failed in {failed['phase']} [{failed['category']}]" if failed else ""
    return StageResult(
        pb.STAGE_STATUS_OK,
        f"{host['hostname']} · {host['os']} · kernel {host['kernel']} · {driver} · {_loads(runtime)} · "
        f"{f'image {ctx.request.image}' if ctx.request.image else 'no image (bare metal)'} · "
        f"sha256 {scene['sha256'][:12]}{deployment}",
    )


def _deployment_error(request: pb.StartRunRequest) -> dict[str, str] | None:
    """The failing deployment's first error, from its own log (when the run was started with one)."""
    if not request.HasField("deployment_error"):
        return None
    error = request.deployment_error
    return {
        "phase": to_id(pb.Phase, error.phase),
        "category": to_id(pb.ErrorCategory, error.category),
        "line": error.line,
        "signature": error.signature,
    }


def _loads(runtime: dict[str, Any]) -> str:
    versions = [
        f"{name} {runtime[key]}" for name, key in (("vLLM", "vllm"), ("torch", "torch"), ("CUDA", "cuda_runtime"))
    ]
    found = [v for v in versions if not v.endswith(" None")]
    return ("loads " + ", ".join(found)) if found else f"versions unknown ({runtime['error'] or 'no vLLM found'})"


def pin(scene: dict[str, Any]) -> dict[str, Any]:
    """The scene with `image.pinned_ref`, the reference by digest the run launches: the ref itself when it
    names a digest, else the registry digest freeze found for the tag (its own repository's first). A tag
    with no registry digest (built or imported locally) stays unpinned: there is nothing to launch it by."""
    image = scene["image"]
    if image is None or image.get("id") is None:
        return scene
    if image["pinned"]:
        return seal({**scene, "image": {**image, "pinned_ref": image["ref"]}})
    repository = images.repository(image["ref"])
    digests = [d for d in image["repo_digests"] or [] if images.is_pinned(d)]
    if not digests:
        return scene
    digest = images.digest(next((d for d in digests if images.repository(d) == repository), digests[0]))
    return seal({**scene, "image": {**image, "pinned": True, "pinned_ref": images.pinned_to(image["ref"], digest)}})


def _pinned(scene: dict[str, Any]) -> tuple[bool, str]:
    """The image by digest and the vLLM version that loads: what makes the scene re-creatable."""
    vllm = scene["runtime"]["vllm"]
    image = scene["image"]
    missing = [] if vllm else ["vLLM version unknown"]
    digest = None
    if image is not None:
        digest = image.get("pinned_ref") or (image["ref"] if image["pinned"] else None)
        if digest is None:
            missing.append(f"image {image['ref']} has no digest ({image['error'] or 'built or imported locally'})")
    if missing:
        return False, "; ".join(missing)
    return True, f"vLLM {vllm}" + (f" · {digest}" if digest else " · bare-metal install")
