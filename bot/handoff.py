"""The hand-off report: one Markdown document a person who never saw the thread can act on.

`k3repro report RUN` prints it and every bundle carries it as `report.md` (bot/bundle.py). Its outline is
vLLM's bug-report form ("Your current environment" as `collect_env.py` prints it, then "Describe the bug" with
a minimal reproducer), filled from what the run recorded: the verdict line, the frozen scene (host and
inside-the-image views), the one-line failing command (a minimize run's result when there is one), the fixed
request as a `curl` line, the first error with its context, the launches' phase timings and the repeat rate,
what the ladder ruled out and the isolated reruns' verdicts. Every line leaves through the one redaction path
(kernel/redact.py): the parts by their kind (argv, JSON, text), then the whole document line by line.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from dataclasses import dataclass
from typing import Any

from bot.record import RunRecord, image_digest
from bot.report import report
from bot.store import Run, Store
from kernel.launches import LaunchSpan
from kernel.redact import printable, redactor
from protos.vocab import API_PATHS, DEFAULT_API, DEFAULT_REPEATS, ChecklistState, LadderOutcome

BASE_URL = "http://localhost:8000"
MAX_CONTEXT_LINES = 40  # of the first error's traceback/context


@dataclass(frozen=True)
class Linked:
    """What other runs say about this one: its minimize result and its isolated reruns' verdicts."""

    minimized: dict[str, Any] | None = None  # the minimal_failing_command artifact of its latest minimize run
    minimize_run: str = ""
    reruns: tuple[tuple[str, str, str], ...] = ()  # (run id, provider, verdict)


def linked(store: Store, run: Run) -> Linked:
    """The run's minimize runs (as `k3repro show` finds them: request_json's minimize_of) and reruns."""
    minimized: dict[str, Any] | None = None
    minimize_run = ""
    for found in store.minimize_runs_of(run.id):
        events = [redactor().message(e) for e in store.events(found.id)]
        text = RunRecord.replay(found.id, events).artifacts.get("minimal_failing_command")
        try:
            value = json.loads(text) if text else None
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("command"), str):
            minimized, minimize_run = value, found.id  # the latest one with a result
    reruns = tuple((r.run_id, r.provider, r.verdict or "none yet") for r in store.reruns_of(run.id))
    return Linked(minimized, minimize_run, reruns)


def run_handoff(store: Store, run_id: str) -> str:
    """The hand-off report of a stored run (any prefix `get_run` accepts)."""
    run = store.get_run(run_id)
    events = [redactor().message(e) for e in store.events(run.id)]
    return handoff(run, RunRecord.replay(run.id, events), linked(store, run))


def handoff(run: Run, record: RunRecord, links: Linked | None = None) -> str:
    """The Markdown document, every line redacted."""
    links = links or Linked()
    found = report(record)
    scene = record.scene or {}
    verdict = found["verdict_line"] or run.summary or f"no verdict: the run is {run.status}"
    title = _title(record, found)
    out = [
        f"# [Bug]: {title}",
        "",
        f"> **Verdict:** {verdict}",
        "",
        f"k3repro run `{run.id}` on cluster `{run.cluster}` · status {run.status} · decision "
        f"{found['decision'] or 'none'} · {found['launches']} engine launch(es) · started {run.created_at}",
        "",
        "### Your current environment",
        "",
        "<details>",
        "<summary>The frozen scene, in the shape of <code>python collect_env.py</code></summary>",
        "",
        "```text",
        *_environment(run, scene),
        "```",
        "",
        "</details>",
        "",
        "### 🐛 Describe the bug",
        "",
        *_describe(found),
        "",
        "#### Minimal reproducer",
        "",
        *_command(run, record, links),
        "",
        *_curl(run, record, scene),
        "",
        "#### First error",
        "",
        *_first_error(record),
        "",
        "#### Timings and repeat rate",
        "",
        *_timings(record.launches),
        "",
        *_repeat(found),
        "",
        "#### What the ladder ruled out",
        "",
        *_ladder(record),
        "",
        "#### Isolated rerun",
        "",
        *_reruns(links),
        "",
        "---",
        f"Written by `k3repro report {run.id}` from the run's recorded events; secrets are redacted.",
    ]
    r = redactor()
    return "".join(r.line(printable(line)) + "\n" for line in "\n".join(out).split("\n"))


def _title(record: RunRecord, found: dict[str, Any]) -> str:
    error = record.first_error
    where = f" with {found['trigger_step']}" if found["trigger_step"] else ""
    if error is not None:
        return f"{error.category or 'error'} in {error.phase or 'an unknown phase'}{where}: {_tail(error.line)}"
    return f"no error reproduced{where}" if record.final else "run not finished"


def _tail(line: str, width: int = 100) -> str:
    """The error's message: what follows its log prefix (`... ERROR 12-05 04:42:58 [file.py:1] `), shortened."""
    text = line.split("] ", 1)[1] if "] " in line else line
    return text if len(text) <= width else text[: width - 1] + "…"


def _value(value: Any) -> str:
    return "N/A" if value is None or value == "" else str(value)


def _environment(run: Run, scene: dict[str, Any]) -> list[str]:
    """The report's environment block, laid out like the output of vLLM's collect_env."""
    runtime, image = scene.get("runtime") or {}, scene.get("image") or {}
    lines = [
        *_host(scene.get("host") or {}),
        "",
        *_gpus(scene.get("nvml") or {}),
        "",
        *_inside_image(runtime),
        "",
        *_image(run, scene, image),
        "",
        *_variables(scene.get("env") or {}, image.get("env") or {}),
        *_caches((scene.get("caches") or {}).get("caches") or []),
    ]
    if not scene:
        lines.append("(the run recorded no scene: it ended before freeze)")
    return lines


def _banner(title: str) -> list[str]:
    return ["==============================", title, "=============================="]


def _host(host: dict[str, Any]) -> list[str]:
    return [
        *_banner("        System Info (host)"),
        f"Hostname                     : {_value(host.get('hostname'))}",
        f"OS                           : {_value(host.get('os'))} ({_value(host.get('arch'))})",
        f"Kernel                       : {_value(host.get('kernel'))}",
    ]


def _gpus(nvml: dict[str, Any]) -> list[str]:
    lines = _banner("   GPU / driver (host, NVML)")
    if not nvml.get("available"):
        return [*lines, f"NVML                         : unavailable ({_value(nvml.get('error'))})"]
    lines += [
        f"Nvidia driver version        : {_value(nvml.get('driver_version'))}",
        f"CUDA driver ceiling          : {_value(nvml.get('cuda_driver_version'))}",
        f"GPU count                    : {_value(nvml.get('gpu_count'))}",
    ]
    for gpu in nvml.get("gpus") or []:
        if isinstance(gpu, dict):
            memory = f", {gpu['memory_total_mib']} MiB" if gpu.get("memory_total_mib") else ""
            lines.append(f"GPU {gpu.get('index', '?')}                        : {gpu.get('name')}{memory}")
    return lines


def _inside_image(runtime: dict[str, Any]) -> list[str]:
    """What the runtime probe found inside the image, as the run loaded it."""
    smi = runtime.get("container_nvidia_smi") or {}
    compat = runtime.get("cuda_compat") or {}
    return [
        *_banner(f"  Inside the image ({_value(runtime.get('source'))} probe, as loaded)"),
        f"Python version               : {_value(runtime.get('python'))}",
        f"vLLM version                 : {_value(runtime.get('vllm'))}",
        f"PyTorch version              : {_value(runtime.get('torch'))}",
        f"CUDA used to build PyTorch   : {_value(runtime.get('torch_cuda'))}",
        f"CUDA runtime version         : {_value(runtime.get('cuda_runtime'))}",
        f"NCCL version                 : {_value(runtime.get('nccl'))}",
        f"Transformers version         : {_value(runtime.get('transformers'))}",
        f"CUDA forward compat loaded   : {_value(compat.get('loaded'))}",
        "nvidia-smi in the container  : "
        + (
            f"driver {smi.get('driver_version')}, CUDA {smi.get('cuda_version')}, {smi.get('gpu_count')} GPU(s)"
            if smi.get("available")
            else f"unavailable ({_value(smi.get('error') or runtime.get('error'))})"
        ),
    ]


def _image(run: Run, scene: dict[str, Any], image: dict[str, Any]) -> list[str]:
    return [
        *_banner("            Image"),
        f"Image ref                    : {_value(image.get('ref') or run.image)}",
        f"Image digest                 : {_value(image_digest(scene))}",
        f"Image id                     : {_value(image.get('id'))}",
        f"Scene sha256                 : {_value(scene.get('sha256'))}",
    ]


def _variables(env: dict[str, Any], image_env: dict[str, Any]) -> list[str]:
    """The variables the host set for the run, then those the image itself sets."""
    lines = _banner("     Environment Variables")
    lines += [f"{k}={v}" for k, v in sorted(env.items())] or ["(none recorded on the host)"]
    if image_env:
        lines += ["# set by the image:", *(f"{k}={v}" for k, v in sorted(image_env.items()))]
    return lines


def _caches(caches: list[Any]) -> list[str]:
    if not caches:
        return []
    lines = ["", *_banner("   Caches (host paths)")]
    for cache in caches:
        if isinstance(cache, dict):
            lines.append(f"{cache.get('name', '?'):<29}: {_cache_line(cache)}")
    return lines


def _cache_line(cache: dict[str, Any]) -> str:
    if not cache.get("exists"):
        return f"{cache.get('path')} (absent)"
    return (
        f"{cache.get('path')} · {cache.get('entries')} entries · {cache.get('size_bytes')} bytes · "
        f"newest {cache.get('newest_mtime')}"
    )


def _describe(found: dict[str, Any]) -> list[str]:
    lines = [f"**What k3repro found:** {found['verdict_line'] or 'no verdict was reached'}"]
    if found["trigger_step"]:
        lines += ["", f"The failure appears when the ladder step `{found['trigger_step']}` is added back."]
    if found["reasons"]:
        lines += ["", "Why this verdict:", *(f"- {reason}" for reason in found["reasons"])]
    return lines


def _command(run: Run, record: RunRecord, links: Linked) -> list[str]:
    r = redactor()
    if links.minimized is not None:
        flags = ", ".join(f"`{f}`" for f in links.minimized.get("flags") or [])
        head = f"The failing command, shrunk to a 1-minimal flag set by minimize run `{links.minimize_run}`"
        head += f" (flags that matter: {flags}):" if flags else ":"
        command = r.line(str(links.minimized["command"]))
    else:
        asked = _asked(run)
        argv = asked.get("argv") or ((record.scene or {}).get("launch") or {}).get("argv") or []
        argv = [str(a) for a in argv] if isinstance(argv, list) else []
        head = "The deployment's command as written (no minimize run yet: `k3repro minimize " + run.id + "`):"
        command = shlex.join(r.argv(argv)) if argv else "(the run recorded no command)"
    return [head, "", "```sh", command, "```"]


def _asked(run: Run) -> dict[str, Any]:
    try:
        asked = json.loads(redactor().json_text(run.request_json or "{}"))
    except ValueError:
        return {}
    return asked if isinstance(asked, dict) else {}


def _curl(run: Run, record: RunRecord, scene: dict[str, Any]) -> list[str]:
    """The fixed request as the run sent it (the scene's request: with the model filled in) as one curl line."""
    asked, kept = _asked(run), scene.get("request")
    api = str((kept or {}).get("api") or asked.get("api") or DEFAULT_API)
    repeats = (kept or {}).get("repeats") or asked.get("repeats") or DEFAULT_REPEATS
    url = BASE_URL + API_PATHS.get(api, API_PATHS[DEFAULT_API])
    if isinstance(kept, dict) and kept.get("body") is None and kept.get("body_sha256"):
        return [
            f"The fixed request ({api} API, sent {repeats}×) is kept only as its sha256 "
            f'(`{kept["body_sha256"]}`: the runner\'s `request_bodies = "hash"`); send the same body to:',
            "",
            "```sh",
            f"curl -sS {url} -H 'Content-Type: application/json' -d @request.json",
            "```",
        ]
    body = kept.get("body") if isinstance(kept, dict) else asked.get("request")
    text = redactor().json_text(str(body or "{}"))
    with contextlib.suppress(ValueError):
        text = json.dumps(json.loads(text), separators=(",", ":"))
    note = ""
    argv = [str(a) for a in asked.get("argv") or []]
    if any(redactor().is_secret_flag(a.partition("=")[0]) and "key" in a for a in argv):
        note = " The deployment serves with an API key: add it as an Authorization header."
    return [
        f"The fixed request ({api} API, sent {repeats}× by the run) against the server:{note}",
        "",
        "```sh",
        f"curl -sS {url} -H 'Content-Type: application/json' -d {shlex.quote(text)}",
        "```",
    ]


def _first_error(record: RunRecord) -> list[str]:
    error = record.first_error
    if error is None:
        failure = record.failure()
        if failure is None:
            return ["No error was met."]
        return [f"No engine error; the run failed in `{failure['phase']}`: {failure['line']}"]
    oom = " · an OOM followed it (secondary)" if error.secondary_oom else ""
    lines = [f"In phase `{error.phase}` · category `{error.category}` · stage `{error.stage}`{oom}:", ""]
    lines += ["```text", error.line, "```"]
    context = [c for c in error.context if c != error.line][-MAX_CONTEXT_LINES:]
    if context:
        lines += ["", "<details>", "<summary>Traceback / context lines</summary>", "", "```text", *context, "```"]
        lines += ["", "</details>"]
    if error.stacks:  # a hang: where each process waited when the runner stopped it (py-spy dumps)
        lines += ["", f"Where it waits (py-spy, before the stop): {error.stacks[0]}", ""]
        lines += ["```text", *error.stacks[1:], "```"] if len(error.stacks) > 1 else []
    if error.hint:
        lines += ["", f"Hint: {error.hint}"]
    return lines


def _timings(launches: list[LaunchSpan]) -> list[str]:
    if not launches:
        return ["No engine launch was recorded."]
    lines = ["| launch | stage | phases reached (s after the launch started) | ended after | failed in |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for span in launches:
        phases = " → ".join(f"{phase} {at - span.start:.1f}" for phase, at in span.phases) or "-"
        failed = f"{span.failure[1]} [{span.failure[2]}]" if span.failure else "-"
        label = span.label + (" (proxy)" if span.proxy else "")
        lines.append(f"| {label} | {span.stage} | {phases} | {span.end - span.start:.1f} s | {failed} |")
    return lines


def _repeat(found: dict[str, Any]) -> list[str]:
    check = found["checklist"].get("failure_repeated") or {}
    evidence = check.get("evidence") or "not measured (the failure was not repeated)"
    lines = [f"Repeat rate: {evidence} ({check.get('state', ChecklistState.PENDING)})."]
    caches = found["checklist"].get("caches_not_stale") or {}
    ran = (ChecklistState.HOLDS, ChecklistState.FAILS, ChecklistState.PENDING)
    if caches.get("state") in ran and caches.get("evidence"):  # a fresh-cache control ran
        lines.append(f"Fresh-cache control: {caches['evidence']} ({caches['state']}).")
    return lines


def _ladder(record: RunRecord) -> list[str]:
    held = [step for step in record.ladder if step.outcome == LadderOutcome.OK]
    lines = [f"- `{step.step}` held: {step.detail or 'no failure'}" for step in held]
    quiet = (LadderOutcome.OK, LadderOutcome.NOT_APPLICABLE)
    others = [step for step in record.ladder if step.outcome not in quiet and step not in held]
    lines += [f"- `{step.step}`: {step.outcome}" + (f" ({step.detail})" if step.detail else "") for step in others]
    skipped = [step.step for step in record.ladder if step.outcome == LadderOutcome.NOT_APPLICABLE]
    if skipped:
        lines.append(f"- not applicable to this deployment: {', '.join(skipped)}")
    return lines or ["The ladder did not run."]


def _reruns(links: Linked) -> list[str]:
    if not links.reruns:
        return ["No isolated rerun yet."]
    return [f"- rerun `{run_id}` ({provider}): verdict **{verdict}**" for run_id, provider, verdict in links.reruns]
