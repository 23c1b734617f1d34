"""The checks a baseline rule can name. Each says whether the rule holds (None: its input is missing),
what was expected, what was found, and why, in words an engineer in an incident reads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from kernel import images
from kernel.baseline.scene_facts import Facts, major_minor, shown


@dataclass(frozen=True)
class Outcome:
    holds: bool | None
    expected: str
    actual: str | None
    message: str


Check = Callable[[Facts, Mapping[str, Any]], Outcome]


def image_cuda_build(facts: Facts, params: Mapping[str, Any]) -> Outcome:
    major = int(params["cuda_major"])
    expected = f"a CUDA {major} build (cu{major}0)"
    ref = (facts.image or {}).get("ref")
    tag = images.tag(ref) if ref else None
    refused = [pattern for pattern in params.get("refused_tags", []) if tag and fnmatchcase(tag, pattern)]
    if refused:
        return Outcome(False, expected, f"tag {tag}", f"tag {tag!r} is not a CUDA {major} build; there is none")
    cuda = facts.loaded_cuda()
    if cuda is None:
        return Outcome(
            None, expected, None, "no CUDA version: the probe found no CUDA runtime or torch, and no image declares one"
        )
    actual = f"CUDA {cuda}" + (f", tag {tag}" if tag else "")
    if cuda.value[0] != major:
        return Outcome(
            False, expected, actual, f"CUDA {shown(cuda.value)} loads; this model needs a CUDA {major} build"
        )
    return Outcome(True, expected, actual, f"CUDA {shown(cuda.value)} build")


def min_driver(facts: Facts, params: Mapping[str, Any]) -> Outcome:
    branch = int(params["min_branch"])
    expected = f"driver r{branch} or newer"
    driver = facts.driver()
    if driver is None:
        return Outcome(None, expected, None, "no driver version: NVML and nvidia-smi are both unavailable")
    if driver.value[0] < branch:
        return Outcome(False, expected, str(driver), f"driver r{driver.value[0]} is older than r{branch}")
    return Outcome(True, expected, str(driver), f"driver r{driver.value[0]}")


def runtime_within_driver(facts: Facts, _: Mapping[str, Any]) -> Outcome:
    expected = "image CUDA runtime <= the host driver's CUDA ceiling"
    cuda, ceiling = facts.loaded_cuda(), facts.cuda_ceiling()
    if cuda is None or ceiling is None:
        missing = "the image's CUDA runtime" if cuda is None else "the driver's CUDA ceiling"
        return Outcome(None, expected, None, f"cannot compare: {missing} is unknown")
    actual = f"runtime {cuda}; ceiling {ceiling}"
    if major_minor(cuda.value) > major_minor(ceiling.value):
        smi = " even though nvidia-smi works in the container" if facts.smi.get("available") else ""
        return Outcome(
            False,
            expected,
            actual,
            f"CUDA {shown(cuda.value)} needs a newer driver than this one (CUDA {shown(ceiling.value)}): CUDA "
            f"initialisation fails{smi}",
        )
    return Outcome(True, expected, actual, f"CUDA {shown(cuda.value)} within the driver's {shown(ceiling.value)}")


def gpu_class(facts: Facts, params: Mapping[str, Any]) -> Outcome:
    pattern, count = str(params["name_pattern"]), int(params["count"])
    expected = f"{count} x {pattern.strip('*')}"
    found = facts.gpus()
    if found is None:
        return Outcome(None, expected, None, "no GPU list: NVML and nvidia-smi are both unavailable")
    names, source = found
    actual = f"{len(names)} x {', '.join(sorted(set(names))) or 'no GPU'} ({source})"
    others = sorted({name for name in names if not fnmatchcase(name, pattern)})
    if len(names) < count or others:
        why = f"other GPUs: {', '.join(others)}" if others else f"{len(names)} GPUs, fewer than {count}"
        return Outcome(False, expected, actual, f"outside the recipe's hardware boundary ({why})")
    return Outcome(True, expected, actual, "within the recipe's hardware boundary")


def image_digest(facts: Facts, _: Mapping[str, Any]) -> Outcome:
    expected = "image launched by digest (repo@sha256:…)"
    image = facts.image
    if image is None or image.get("id") is None:
        why = "no image (bare-metal install)" if image is None else f"image not inspected: {image.get('error')}"
        return Outcome(None, expected, None, why)
    ref, digests = image["ref"], image.get("repo_digests") or []
    if image.get("pinned"):
        pinned = image.get("pinned_ref") or ref  # set by freeze: the run and any rerun launch by it
        digest = images.digest(pinned)
        if pinned != ref:
            return Outcome(True, expected, f"{ref} → {pinned}", f"tag pinned by freeze to {digest}")
        return Outcome(True, expected, ref, f"pinned to {digest}")
    if digests:
        return Outcome(False, expected, ref, f"tag not pinned; it resolves to {digests[0]}: launch by that digest")
    return Outcome(
        False,
        expected,
        f"{ref} (no registry digest)",
        "tag not pinned and has no registry digest (built or imported locally): it cannot be rolled back by digest",
    )


def compat_libs(facts: Facts, _: Mapping[str, Any]) -> Outcome:
    expected = "compat libraries loaded only when the driver's CUDA ceiling is below the image's CUDA"
    compat = facts.runtime.get("cuda_compat")
    if compat is None:
        return Outcome(None, expected, None, "the probe did not look for compat libraries")
    if not compat.get("loaded"):
        return Outcome(True, expected, "not loaded", "no CUDA compat libraries on the loader's path")
    where = f"{', '.join(compat.get('dirs') or [])} via {', '.join(compat.get('via') or [])}"
    actual = f"loaded: {where}" + (f" (compat driver {compat['driver']})" if compat.get("driver") else "")
    cuda, ceiling = facts.loaded_cuda(), facts.cuda_ceiling()
    if cuda is None or ceiling is None:
        return Outcome(None, expected, actual, "compat libraries load, but whether the driver needs them is unknown")
    if major_minor(cuda.value) <= major_minor(ceiling.value):
        return Outcome(
            False,
            expected,
            actual,
            f"the host driver (CUDA {shown(ceiling.value)}) covers CUDA {shown(cuda.value)}, yet the container "
            "loads compat libraries: it still runs the old environment",
        )
    return Outcome(True, expected, actual, f"forward compatibility in use for CUDA {shown(cuda.value)}")


# check name -> (function, parameters: name -> (type, required))
CHECKS: dict[str, tuple[Check, dict[str, tuple[type, bool]]]] = {
    "image_cuda_build": (image_cuda_build, {"cuda_major": (int, True), "refused_tags": (list, False)}),
    "min_driver": (min_driver, {"min_branch": (int, True)}),
    "runtime_within_driver": (runtime_within_driver, {}),
    "gpu_class": (gpu_class, {"name_pattern": (str, True), "count": (int, True)}),
    "image_digest": (image_digest, {}),
    "compat_libs": (compat_libs, {}),
}
