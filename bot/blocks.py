"""The one description of a run's messages: what each says, as structure (bot/rich.py), built once per message
or event. Slack posts it as Block Kit (the card, the live checklist, a message per stage and ladder step, the
verdict); the terminal prints the same structure as text (bot/render.py), the live stream event by event
(EventBlocks). Every one is a projection of the run's record (bot/record.py). Kept within Slack's limits; whatever
does not fit goes to a file.

Limits (docs.slack.dev, and bolt-js #2509 for the undocumented aggregate): ≤ 50 blocks, section text
≤ 3000 characters, about 12 000 characters of blocks per message.

Every text that comes from a run (an engine's lines, a runner's or a person's words, an image name) is a span
of the structure, escaped only when rendered to mrkdwn (code spans and blocks included): a `<!channel>` or
`<https://…|Fix applied>` in it is shown, never obeyed. The terminal shows it as it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bot.record import (
    Check,
    Finished,
    FirstError,
    LadderStep,
    PhaseReached,
    RunRecord,
    StageResult,
    StageStarted,
    is_file,
)
from bot.rich import (
    Block,
    Context,
    Field,
    Fields,
    Item,
    Part,
    Section,
    SlackOnly,
    Text,
    bold,
    clip,
    code,
    escaped,
    fence,
    joined,
    lines,
    mention,
    mentioning,
    mrkdwn,
    mrkdwn_blocks,
    text,
)
from bot.store import RunState
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, ChecklistState, Decision, LadderOutcome, RunStatus, StageStatus

MAX_BLOCKS = 50
MAX_SECTION = 3000
MAX_MESSAGE = 12_000
EVIDENCE_CHARS = 240
CONTEXT_LINES = 6
STACK_LINES = 12  # processes listed under a hang's headline (an 8-GPU engine has about a dozen)

ACTION_RERUN = "k3repro_rerun_isolated"
ACTION_CANCEL = "k3repro_cancel"
ACTION_MINIMIZE = "k3repro_minimize"
MINIMAL = "minimal_failing_command"  # the artifact a minimize run ends with (runner/stages/minimize.py)
METADATA_EVENT = "k3repro_run"

RUN_MARK = {
    RunState.RUNNING: "🔄",
    RunState.COMPLETED: "✅",
    RunState.CANCELLED: "⊘",
    RunState.ERROR: "⚠️",
    RunState.LOST: "⚠️",
}
STAGE_MARK = {StageStatus.OK: "✅", StageStatus.FAILED: "❌", StageStatus.SKIPPED: "⏭", StageStatus.CANCELLED: "⊘"}
DECISION_MARK = {Decision.FIX: "🛠", Decision.ISOLATE: "🧪", Decision.CONTINUE: "🔎"}
CHECK_MARK = {ChecklistState.HOLDS: "✅", ChecklistState.FAILS: "❌", ChecklistState.NOT_APPLICABLE: "➖"}
PENDING_MARK = "⬜"


@dataclass(frozen=True)
class Message:
    text: str  # the notification / accessibility fallback
    blocks: list[Block]
    overflow: str = ""  # the full text when the blocks had to be shortened: attach it as a file

    def args(self) -> dict[str, Any]:
        return {"text": self.text, "blocks": self.blocks}


def section(*parts: Part, block_id: str = "", limit: int = 0) -> Section:
    return Section(text(*parts), block_id, limit)


def context(*parts: Part, limit: int = 0) -> Context:
    return Context(text(*parts), limit)


SHORTENED = {
    "type": "context",
    "elements": [{"type": "mrkdwn", "text": "_Shortened to fit Slack; the full text is in the attached file._"}],
}


def fit(fallback: str, items: list[Item]) -> Message:
    """The message as Block Kit, shortened where it is too long for Slack; the message then says so and carries
    its full text (as the terminal reads it) for a file."""
    blocks = mrkdwn_blocks(items)
    long = any(isinstance(block.get("text"), dict) and len(block["text"]["text"]) > MAX_SECTION for block in blocks)
    if not long and _fits(blocks, MAX_BLOCKS, MAX_MESSAGE):
        return Message(clip(fallback, 3000), blocks, "")
    clipped = False
    for block in blocks:
        body = block.get("text")
        if isinstance(body, dict) and len(body["text"]) > MAX_SECTION:
            short = clip(body["text"], MAX_SECTION - 4)
            body["text"], clipped = short + ("```" if short.count("```") % 2 else ""), True
    if clipped or not _fits(blocks, MAX_BLOCKS, MAX_MESSAGE):
        budget = MAX_MESSAGE - len(json.dumps(SHORTENED))
        while len(blocks) > 1 and not _fits(blocks, MAX_BLOCKS - 1, budget):
            blocks.pop(-2 if blocks[-1]["type"] == "actions" else -1)
        blocks.append(SHORTENED)
        clipped = True
    return Message(clip(fallback, 3000), blocks, "\n".join(lines(items)) if clipped else "")


def _fits(blocks: list[Block], most_blocks: int, most_chars: int) -> bool:
    return len(blocks) <= most_blocks and len(json.dumps(blocks)) <= most_chars


def metadata(view: RunRecord) -> dict[str, Any]:
    return {"event_type": METADATA_EVENT, "event_payload": {"run_id": view.run_id, "cluster": view.cluster}}


def _where(view: RunRecord) -> Text:
    """Where a run is: its stage and phase, or (between stages) its status."""
    if not view.stage:
        return text(f"run {view.status}")
    return text("stage ", code(view.stage), *((" · phase ", code(view.phase)) if view.phase else ()))


def card(view: RunRecord) -> Message:
    """The parent message in the channel: what runs where, and its state."""
    mark = RUN_MARK.get(view.status, "•")
    kind, of = ("minimize run", (" of ", code(view.minimize_of))) if view.minimize_of else ("run", ())
    doing = _where(view) if view.stage else text()
    state = view.status + (f" — {view.decision}" if view.decision else "")
    runner = view.host + (f" ({view.runner})" if view.host else "") if view.host else view.runner
    digest = (
        text(code(view.digest)) if view.digest else text("none: known by tag only" if view.final else "not known yet")
    )
    fields = [
        Field("Cluster", text(view.cluster), 1900),
        Field("Runner", text(runner), 1900),
        Field("Image", text(code(view.image)), 1900),
        Field("Digest", digest, 1900),
        Field("Status", text(f"{mark} {state}"), 1900),
        Field("Started by", text(mention(view.requested_by) if view.requested_by else "-"), 1900),
    ]
    items: list[Item] = [
        section(bold(f"k3repro {kind}"), " ", code(view.run_id), *of, " on ", bold(view.cluster), block_id="title"),
        Fields(tuple(fields), "facts"),
        Context(_verdict_line(view) or doing or text(view.problem) or text("details in the thread"), 2000),
    ]
    buttons: list[Block] = [
        {"type": "button", "action_id": ACTION_RERUN, "text": _plain("Rerun on isolated node"), "value": view.run_id}
    ]
    if view.final and view.trigger is not None:  # the ladder named a trigger step: its flags can be shrunk
        buttons.append(
            {"type": "button", "action_id": ACTION_MINIMIZE, "text": _plain("Minimize flags"), "value": view.run_id}
        )
    if not view.final:
        buttons.append(
            {
                "type": "button",
                "action_id": ACTION_CANCEL,
                "text": _plain("Cancel"),
                "style": "danger",
                "value": view.run_id,
                "confirm": {
                    "title": _plain("Cancel this run?"),
                    "text": _plain(f"The run on {view.cluster} stops; its engine's processes are stopped."),
                    "confirm": _plain("Cancel run"),
                    "deny": _plain("Keep running"),
                },
            }
        )
    items.append(SlackOnly({"type": "actions", "block_id": "run_actions", "elements": buttons}))
    return fit(f"{mark} k3repro {kind} {escaped(view.run_id)} on {escaped(view.cluster)}: {escaped(state)}", items)


def _verdict_line(view: RunRecord) -> Text:
    """The verdict's one line, first thing in the card once the run has one."""
    finished = view.finished
    if finished is None or not finished.headline:
        return text()
    decision = finished.decision
    mark = DECISION_MARK[decision] if decision else "•"
    return text(f"{mark} ", bold(decision or ""), " — ", finished.headline)


MAX_CONFIRM_TEXT = 300  # Slack's limit on a confirmation dialog's text
LAUNCH_CONFIRMS = {  # button -> (its dialog's title, its confirm button)
    ACTION_RERUN: ("Rerun on an isolated node of {cluster}?", "Rerun"),
    ACTION_MINIMIZE: ("Minimize the flags on {cluster}?", "Minimize"),
}


def confirm_launches(card: Message, cluster: str, command: str) -> Message:
    """The card with a confirmation dialog on each button that launches something (Rerun, Minimize): it shows
    `command` (the cluster's configured launch command, redacted by the caller) before Slack sends the click.
    A command over Slack's 300 characters of dialog text is shortened, with an ellipsis."""
    for block in card.blocks:
        for button in block.get("elements", []) if block["type"] == "actions" else []:
            if button.get("action_id") in LAUNCH_CONFIRMS:
                title, go = LAUNCH_CONFIRMS[button["action_id"]]
                button["confirm"] = {
                    "title": _plain(clip(title.format(cluster=cluster), 100)),
                    "text": _plain(clip(f"Launches: {command}", MAX_CONFIRM_TEXT)),
                    "confirm": _plain(go),
                    "deny": _plain("Not now"),
                }
    return card


def checklist(view: RunRecord) -> Message:
    """The live checklist: the same blocks from first to last state (a heading, one per item, a footer), so
    every chat.update keeps the layout."""
    where = _where(view)
    run = context("run ", code(view.run_id), " · updated as the run goes")
    if view.minimize_of:  # it settles none of the method's items: they are the original run's
        now = text(bold("Checklist"), " · a minimize run settles none: see run ", code(view.minimize_of), " · ", *where)
        return fit(mrkdwn(now), [Section(now, "now"), run])
    held = sum(1 for check in view.checklist.values() if check.holds)
    moot = sum(1 for check in view.checklist.values() if check.state == ChecklistState.NOT_APPLICABLE)
    counted = f"{held}/{len(CHECKLIST_IDS) - moot} hold" + (f" ({moot} not applicable)" if moot else "")
    items: list[Item] = [section(bold("Checklist"), f" · {counted} · ", *where, block_id="now")]
    for item in CHECKLIST_IDS:
        check = view.checklist.get(item) or Check(item, ChecklistState.PENDING, "")
        items.append(Section(checklist_line(check, EVIDENCE_CHARS), item))
    items.append(run)
    return fit(f"Checklist: {counted} · {mrkdwn(where)}", items)


def stage_result(view: RunRecord, finished: StageResult) -> Message:
    """One message per finished stage; a failure shows the first error, its context, the hint and the OOM call."""
    mark, stage = _stage_mark(finished), finished.stage or "run"
    return fit(escaped(f"{mark} {stage}: {clip(finished.summary, 300)}"), stage_said(view, finished))


def stage_said(view: RunRecord, finished: StageResult) -> list[Item]:
    """What a finished stage's message says (`stage_result`: as Slack gets it)."""
    stage = finished.stage or "run"
    items: list[Item] = [stage_head(finished)]
    items += [Section(artifact_note(a)) for a in view.notes.get(stage, [])]
    proxied = [proxy_label(s.source, s.proxies) for s in view.launches if s.stage == stage and s.proxy]
    if proxied:
        items.append(context("proxy launches: ", *joined(proxied, " · "), limit=2900))
    if stage == "ladder" and view.ladder:
        items.append(ladder_summary(view.ladder))
    error = view.first_errors.get(stage)
    if error is not None and finished.status == StageStatus.FAILED:
        items += first_error_blocks(error)
    if stage == "single_request" and view.requests:
        items.append(section(fence(line for r in view.requests for line in request_lines(r))))
    return items


def _stage_mark(finished: StageResult) -> str:
    """A check mark means good: the verdict stage shows its decision's mark, not the stage's having run."""
    if finished.stage == "verdict" and finished.status == StageStatus.OK:  # its summary: "<decision>: <headline>"
        decision = finished.summary.split(":", 1)[0]
        return DECISION_MARK[Decision(decision)] if decision in DECISION_MARK else "•"
    return STAGE_MARK[finished.status] if finished.status else "•"


def stage_head(finished: StageResult) -> Section:
    stage = finished.stage or "run"
    summary = clip(finished.summary, 2800)
    return section(f"{_stage_mark(finished)} ", bold(stage), " — ", summary, block_id="result")


def first_error_blocks(error: FirstError) -> list[Item]:
    """Where the first error happened and what it is, its context, the hint, and whether an OOM is secondary."""
    oom = "yes — an OOM was seen, but it is not the cause" if error.secondary_oom else "no"
    phase, category = Field("Phase", text(error.phase)), Field("Category", text(error.category))
    items: list[Item] = [
        section("🔥 ", bold("First error"), "\n", fence([error.line])),
        Fields((phase, category, Field("Secondary OOM", text(oom))), "first_error"),
    ]
    if error.context:
        items.append(section(bold("Context"), "\n", fence(error.context[:CONTEXT_LINES])))
    if error.stacks:  # a hang: where each process waited, from the stacks dumped before the stop
        items.append(section(bold("Where it waits:"), " ", error.stacks[0], limit=MAX_SECTION))
        if len(error.stacks) > 1:
            listed = [clip(line, 200) for line in error.stacks[1 : 1 + STACK_LINES]]
            items.append(section(bold("Stacks (py-spy)"), "\n", fence(listed)))
    if error.hint:
        items.append(section(bold("Hint:"), " ", error.hint))
    return items


def update_note(error: FirstError) -> Text:
    """What an update to the first error above changes (the wire's `update`; today only a later OOM)."""
    if error.secondary_oom:
        return text(
            "the first error in ", code(error.phase), " above stands: an out-of-memory error followed it, not its cause"
        )
    return text("the first error in ", code(error.phase), " above, restated by the analyzer")


def checklist_line(check: Check, evidence_chars: int | None = None) -> Text:
    evidence = clip(check.evidence, evidence_chars) if evidence_chars else check.evidence
    mark = CHECK_MARK.get(check.state, PENDING_MARK)  # unset: pending
    return text(f"{mark} ", bold(check.item), *((" — ", evidence) if evidence else ()))


def proxy_note(source: str, proxies: Iterable[tuple[str, str]], line: str) -> Text:
    """How the terminal labels a proxy launch as it starts; `proxies`: (id, what it removes)."""
    used = list(proxies)
    ids, removes = " + ".join(p for p, _ in used), "; no ".join(r for _, r in used)
    return text("proxy launch: ", code(clip(f"{source}: {ids} (no {removes}) — {line}", 2800)))


def proxy_label(source: str, proxies: Iterable[tuple[str, str]]) -> Text:
    """A proxy launch in a stage's message: where and which proxies, not the whole command again."""
    return text(code(source), " (", " + ".join(p for p, _ in proxies), ")")


def ladder_summary(steps: Iterable[LadderStep]) -> Section:
    """The ladder in one block: a line per step that ran, the steps that did not apply named together; a
    failure's error line is the stage's first error, shown once below."""
    shown: list[Text] = []
    moot = []
    for step in steps:
        title = step.wire.title or step.step
        if step.outcome == LadderOutcome.NOT_APPLICABLE and step.wire.as_written:  # not needed, and why
            shown.append(text("➖ ", bold(title), ": ", step.detail))
            continue
        if step.outcome == LadderOutcome.NOT_APPLICABLE:
            moot.append(title)
            continue
        added = (" — adds ", code(clip(" ".join(step.wire.added), 300))) if step.wire.added else ()
        how = "relaunched" if step.relaunched else "same server"
        failed = (" in ", code(step.phase), f" [{step.category}]") if step.signature else ()
        shown.append(text("🪜 ", bold(title), ": ", code(step.outcome or ""), *failed, f" ({how})", *added))
    if moot:
        shown.append(text(f"➖ not applicable (the deployment sets none of their flags): {', '.join(moot)}"))
    return Section(joined(shown), "ladder_steps", MAX_SECTION)


def artifact_note(artifact: pb.Artifact) -> Text:
    """A one-line artifact as it reads in a message; anything bigger is named (it goes to a file)."""
    if is_file(artifact):
        size = len(artifact.content)
        return text(f"recorded {artifact.name} ({size} bytes; ", code("k3repro show RUN --json"), " prints it)")
    return text(f"{artifact.name.replace('_', ' ')}: ", code(clip(artifact.content, 2800)))


def request_lines(r: pb.RequestResult) -> list[str]:
    """A request's result, then the warnings the engine logged while it ran."""
    answer = f"HTTP {r.http_status}" if r.http_status else "no answer"
    line = (
        f"request #{r.attempt}: {answer} · finish {r.finish_reason or '-'} · {r.prompt_tokens} prompt → "
        f"{r.completion_tokens} completion tokens (max_tokens {r.max_tokens}) · {r.latency_s:.2f} s"
    )
    if r.gpu_memory_before_mib or r.gpu_memory_after_mib:
        line += f" · GPU memory {r.gpu_memory_before_mib:,} → {r.gpu_memory_after_mib:,} MiB"
    if r.warnings:
        line += f" · {len(r.warnings)} warning(s)"
    return [line + (f" — {r.error}" if r.error else ""), *(f"  warning: {w}" for w in r.warnings)]


def ladder_block(step: LadderStep) -> Section:
    return section("🪜 ", bold(f"ladder · {step.step}"), ": ", code(step.outcome or ""), f" {step.detail}".rstrip())


def verdict(view: RunRecord, finished: Finished) -> Message:
    status, decision = finished.status, finished.decision
    minimal = view.artifacts.get(MINIMAL, "")
    return fit(
        escaped(f"{decision or status}: {clip(finished.summary, 300)}"),
        verdict_blocks(view.run_id, view.cluster, finished, minimal),
    )


def verdict_blocks(run_id: str, cluster: str, finished: Finished, minimal: str = "") -> list[Item]:
    """The run's last message; a minimize run's (`minimal`: its result) ends with the command that fails."""
    status, decision = finished.status, finished.decision
    title = bold(f"Verdict: {decision}") if decision else bold(f"Run {status or ''}")
    if minimal and not decision and status == RunStatus.COMPLETED:
        title = bold("Minimize result")
    mark = DECISION_MARK[decision] if decision else RUN_MARK[RunState(status)] if status else "•"
    where = (" on ", bold(cluster)) if cluster else ()
    items: list[Item] = [section(f"{mark} ", title, " · run ", code(run_id), *where, block_id="verdict")]
    if finished.headline:
        items.append(section(bold(finished.headline), block_id="verdict_line"))
    if minimal and finished.summary == "every stage succeeded":  # the result below says what it found
        return items + minimal_blocks(minimal)
    if finished.summary and not finished.headline:  # the verdict line says what the summary would
        items.append(Section(mentioning(finished.summary)))
    reasons = [reason for reason in finished.reasons if reason != finished.summary]
    if reasons:
        items.append(Section(joined([text("• ", *mentioning(reason)) for reason in reasons])))
    return items + (minimal_blocks(minimal) if minimal else [])


def minimal_blocks(content: str) -> list[Item]:
    """A minimize run's result: the one line that fails, what was shown irrelevant, what the search cost."""
    result = json.loads(content)
    flags, irrelevant, failure = result["flags"], result["irrelevant"], result["failure"]
    shown = [
        text(
            bold("1-minimal failing command"),
            f" ({len(flags)} of {len(flags) + len(irrelevant)} flags beyond the essentials; fails in ",
            code(failure["phase"]),
            f" ({failure['category']}) with the same first error)",
        ),
        text(fence([result["command"]])),
    ]
    if irrelevant:
        shown.append(text("irrelevant to the failure: ", *joined([text(code(flag)) for flag in irrelevant], " ")))
    if result["unresolved_removals"]:
        unresolved = joined([text(code(flag)) for flag in result["unresolved_removals"]], " ")
        shown.append(text("taking these away was unresolved (vLLM refused, or another failure): ", *unresolved))
    caveats = [] if result["confirmed_on_real"] else ["NOT confirmed on the real configuration"]
    caveats += [] if result["one_minimal"] else ["the search stopped at its test limit: not proven 1-minimal"]
    shown.append(
        text(
            f"{len(result['tests'])} flag sets tested, {result['launches']} launches, confidence "
            f"{result['confidence']:.2f}" + "".join(f" · {caveat}" for caveat in caveats)
        )
    )
    return [Section(joined(shown), "minimal", MAX_SECTION)]


def problem(view: RunRecord) -> Message:
    body = section("⚠️ ", bold(f"Run {view.status}"), " — ", clip(view.problem, 2800))
    return fit(escaped(f"run {view.run_id}: {view.status}"), [body])


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text}


class EventBlocks:
    """The live stream of a run as blocks, event by event (what the terminal prints as it happens), from the
    facts its record folds in. A first error already shown in full (a repeat attempt, a ladder step reproducing
    it) is shown again in one line."""

    def __init__(self, *, logs: bool = False) -> None:
        self.logs = logs
        self.record = RunRecord("")

    def of(self, event: pb.RunEvent) -> list[Item]:
        """The blocks of one event; [] for what a reader does not need (heartbeats, engine logs by default)."""
        fact = self.record.apply(event)
        if isinstance(fact, StageStarted):
            return [context("▶ ", bold(fact.stage), *((" — ", fact.detail) if fact.detail else ()))]
        if isinstance(fact, StageResult):
            return [stage_head(fact)]
        if isinstance(fact, PhaseReached):
            return [context("phase ", code(fact.phase))]
        if isinstance(fact, FirstError) and fact.update:
            return [Context(update_note(fact))]
        if isinstance(fact, FirstError) and fact.repeat:
            return [context("the same first error again in ", code(fact.phase), " (shown above)")]
        if isinstance(fact, FirstError):
            return first_error_blocks(fact)
        if isinstance(fact, Check):
            return [Section(checklist_line(fact))]
        if isinstance(fact, LadderStep):
            return [ladder_block(fact)]
        if isinstance(fact, pb.RequestResult):
            return [context(line) for line in request_lines(fact)]
        if isinstance(fact, pb.Artifact):
            return [Context(artifact_note(fact))]
        if isinstance(fact, pb.LaunchStarted) and fact.proxies:
            return [Context(proxy_note(fact.source, ((p.id, p.removes) for p in fact.proxies), fact.line))]
        if isinstance(fact, pb.LogChunk) and self.logs:
            return [section("log ", code(fact.source), "\n", fence(fact.lines))]
        if isinstance(fact, Finished):
            return verdict_blocks(event.run_id, "", fact, self.record.artifacts.get(MINIMAL, ""))
        return []
