"""The one renderer of a run: Block Kit. Slack posts these blocks (the card, the live checklist, a message per
stage and ladder step, the verdict); the terminal prints the same blocks as text (bot/render.py), the live
stream event by event (EventBlocks). Every one is a projection of the run's record (bot/record.py). Kept within Slack's limits; whatever does not fit goes to a file.

Limits (docs.slack.dev, and bolt-js #2509 for the undocumented aggregate): ≤ 50 blocks, section text
≤ 3000 characters, about 12 000 characters of blocks per message.

Every text that comes from a run (an engine's lines, a runner's or a person's words, an image name) enters
mrkdwn through `escaped`, code spans and blocks included: a `<!channel>` or `<https://…|Fix applied>` in it is
shown, never obeyed. The terminal (`text_lines`) shows it as it was.
"""

from __future__ import annotations

import json
import re
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
from bot.store import RunState
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, ChecklistState, Decision, LadderOutcome, RunStatus, StageStatus

MAX_BLOCKS = 50
MAX_SECTION = 3000
MAX_MESSAGE = 12_000
EVIDENCE_CHARS = 240
CONTEXT_LINES = 6
STACK_LINES = 12  # processes listed under a hang's headline (an 8-GPU engine has about a dozen)

Block = dict[str, Any]
_FENCE = re.compile(r"```(.*?)```", re.DOTALL)
_BOLD = re.compile(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])")
_LINK = re.compile(r"<(?:[@#!])?([^<>|]+)(?:\|([^<>]+))?>")
_MENTION = re.compile(r"&lt;@([UW][A-Z0-9-]{1,20})&gt;")
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


def escaped(text: str) -> str:
    """Text as Slack's mrkdwn shows it literally: `&`, `<`, `>` as the entities Slack's formatting rules ask
    for, so no mention, link or date can be made of it."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escaped_but_mentions(text: str) -> str:
    """`escaped`, but a user mention (`<@U…>`) stays one: the bot writes them into what a run says (who
    cancelled it, in the reason the runner echoes). A mention can only name one person: it cannot notify a
    channel or disguise a link."""
    return _MENTION.sub(r"<@\1>", escaped(text))


def _unescaped(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def section(text: str, block_id: str | None = None) -> Block:
    block: Block = {"type": "section", "text": {"type": "mrkdwn", "text": text}}
    if block_id:
        block["block_id"] = block_id
    return block


def context(text: str) -> Block:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def code(lines: list[str]) -> str:
    return "```" + "\n".join(escaped(line).replace("```", "'''") for line in lines) + "```"


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def text_lines(blocks: list[Block]) -> list[str]:
    """Blocks as plain text: mrkdwn marks dropped, code as `| ` lines, fields on one line; buttons left out."""
    lines: list[str] = []
    for block in blocks:
        if block["type"] == "section" and "fields" in block:
            lines.append(" · ".join(unmarked(f["text"]).replace("\n", ": ", 1) for f in block["fields"]))
        if block["type"] == "section" and "text" in block:
            lines += _mrkdwn_lines(block["text"]["text"])
        elif block["type"] == "context":
            lines += _mrkdwn_lines(" ".join(e["text"] for e in block["elements"] if "text" in e))
    return lines


def _mrkdwn_lines(text: str) -> list[str]:
    lines: list[str] = []
    position = 0
    for fence in _FENCE.finditer(text):
        lines += unmarked(text[position : fence.start()]).splitlines()
        lines += [f"| {_unescaped(line)}" for line in fence.group(1).split("\n")]
        position = fence.end()
    lines += unmarked(text[position:]).splitlines()
    return [line for line in lines if line.strip()]


def unmarked(text: str) -> str:
    """mrkdwn as the terminal prints it: links as their text, no bold or code marks, escaped text as it was."""
    text = _LINK.sub(lambda m: m.group(2) or ("@" + m.group(1) if m.group(0)[1] == "@" else m.group(1)), text)
    return _unescaped(_BOLD.sub(r"\1", text).replace("`", ""))


SHORTENED = {
    "type": "context",
    "elements": [{"type": "mrkdwn", "text": "_Shortened to fit Slack; the full text is in the attached file._"}],
}


def fit(text: str, blocks: list[Block]) -> Message:
    """Shortens what is too long for Slack; the message then says so and carries its full text for a file (the
    blocks' text is rendered only then: most messages fit as they are)."""
    long = any(isinstance(block.get("text"), dict) and len(block["text"]["text"]) > MAX_SECTION for block in blocks)
    if not long and _fits(blocks, MAX_BLOCKS, MAX_MESSAGE):
        return Message(clip(text, 3000), blocks, "")
    full = "\n".join(text_lines(blocks))
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
    return Message(clip(text, 3000), blocks, full if clipped else "")


def _fits(blocks: list[Block], most_blocks: int, most_chars: int) -> bool:
    return len(blocks) <= most_blocks and len(json.dumps(blocks)) <= most_chars


def metadata(view: RunRecord) -> dict[str, Any]:
    return {"event_type": METADATA_EVENT, "event_payload": {"run_id": view.run_id, "cluster": view.cluster}}


def card(view: RunRecord) -> Message:
    """The parent message in the channel: what runs where, and its state."""
    mark = RUN_MARK.get(view.status, "•")
    kind, of = ("minimize run", f" of `{escaped(view.minimize_of)}`") if view.minimize_of else ("run", "")
    doing = escaped(f"stage `{view.stage}`" + (f" · phase `{view.phase}`" if view.phase else "")) if view.stage else ""
    state = escaped(view.status + (f" — {view.decision}" if view.decision else ""))
    runner = escaped(view.host + (f" ({view.runner})" if view.host else "") if view.host else view.runner)
    digest = (
        f"`{escaped(view.digest)}`" if view.digest else "none: known by tag only" if view.final else "not known yet"
    )
    fields = [
        ("Cluster", escaped(view.cluster)),
        ("Runner", runner),
        ("Image", f"`{escaped(view.image)}`"),
        ("Digest", digest),
        ("Status", f"{mark} {state}"),
        ("Started by", f"<@{escaped(view.requested_by)}>" if view.requested_by else "-"),
    ]
    blocks: list[Block] = [
        section(f"*k3repro {kind}* `{escaped(view.run_id)}`{of} on *{escaped(view.cluster)}*", "title"),
        {
            "type": "section",
            "block_id": "facts",
            "fields": [{"type": "mrkdwn", "text": f"*{name}*\n{clip(value, 1900)}"} for name, value in fields],
        },
        context(clip(_verdict_line(view) or doing or escaped(view.problem) or "details in the thread", 2000)),
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
    blocks.append({"type": "actions", "block_id": "run_actions", "elements": buttons})
    return fit(f"{mark} k3repro {kind} {escaped(view.run_id)} on {escaped(view.cluster)}: {state}", blocks)


def _verdict_line(view: RunRecord) -> str:
    """The verdict's one line, first thing in the card once the run has one."""
    finished = view.finished
    if finished is None or not finished.headline:
        return ""
    decision = finished.decision
    mark = DECISION_MARK[decision] if decision else "•"
    return f"{mark} *{escaped(decision or '')}* — {escaped(finished.headline)}"


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
    where = escaped(
        f"stage `{view.stage}`" + (f" · phase `{view.phase}`" if view.phase else "")
        if view.stage
        else f"run {view.status}"
    )
    run = f"run `{escaped(view.run_id)}` · updated as the run goes"
    if view.minimize_of:  # it settles none of the method's items: they are the original run's
        text = f"*Checklist* · a minimize run settles none: see run `{escaped(view.minimize_of)}` · {where}"
        return fit(text, [section(text, "now"), context(run)])
    held = sum(1 for check in view.checklist.values() if check.holds)
    moot = sum(1 for check in view.checklist.values() if check.state == ChecklistState.NOT_APPLICABLE)
    counted = f"{held}/{len(CHECKLIST_IDS) - moot} hold" + (f" ({moot} not applicable)" if moot else "")
    blocks = [section(f"*Checklist* · {counted} · {where}", "now")]
    for item in CHECKLIST_IDS:
        check = view.checklist.get(item) or Check(item, ChecklistState.PENDING, "")
        blocks.append(section(checklist_line(check, EVIDENCE_CHARS), item))
    blocks.append(context(run))
    return fit(f"Checklist: {counted} · {where}", blocks)


def stage_result(view: RunRecord, finished: StageResult) -> Message:
    """One message per finished stage; a failure shows the first error, its context, the hint and the OOM call."""
    stage = finished.stage or "run"
    blocks = [stage_head(finished)]
    blocks += [section(artifact_note(a)) for a in view.notes.get(stage, [])]
    proxied = [proxy_label(s.source, s.proxies) for s in view.launches if s.stage == stage and s.proxy]
    if proxied:
        blocks.append(context(clip("proxy launches: " + " · ".join(proxied), 2900)))
    if stage == "ladder" and view.ladder:
        blocks.append(ladder_summary(view.ladder))
    error = view.first_errors.get(stage)
    if error is not None and finished.status == StageStatus.FAILED:
        blocks += first_error_blocks(error)
    if stage == "single_request" and view.requests:
        blocks.append(section(code([line for r in view.requests for line in request_lines(r)])))
    mark = _stage_mark(finished)
    return fit(escaped(f"{mark} {stage}: {clip(finished.summary, 300)}"), blocks)


def _stage_mark(finished: StageResult) -> str:
    """A check mark means good: the verdict stage shows its decision's mark, not the stage's having run."""
    if finished.stage == "verdict" and finished.status == StageStatus.OK:  # its summary: "<decision>: <headline>"
        decision = finished.summary.split(":", 1)[0]
        return DECISION_MARK[Decision(decision)] if decision in DECISION_MARK else "•"
    return STAGE_MARK[finished.status] if finished.status else "•"


def stage_head(finished: StageResult) -> Block:
    stage = finished.stage or "run"
    summary = escaped(clip(finished.summary, 2800))
    return section(f"{_stage_mark(finished)} *{escaped(stage)}* — {summary}", "result")


def first_error_blocks(error: FirstError) -> list[Block]:
    """Where the first error happened and what it is, its context, the hint, and whether an OOM is secondary."""
    oom = "yes — an OOM was seen, but it is not the cause" if error.secondary_oom else "no"
    blocks: list[Block] = [
        section("🔥 *First error*\n" + code([error.line])),
        {
            "type": "section",
            "block_id": "first_error",
            "fields": [
                {"type": "mrkdwn", "text": f"*Phase*\n{escaped(error.phase)}"},
                {"type": "mrkdwn", "text": f"*Category*\n{escaped(error.category)}"},
                {"type": "mrkdwn", "text": f"*Secondary OOM*\n{oom}"},
            ],
        },
    ]
    if error.context:
        blocks.append(section("*Context*\n" + code(list(error.context[:CONTEXT_LINES]))))
    if error.stacks:  # a hang: where each process waited, from the stacks dumped before the stop
        blocks.append(section(clip(f"*Where it waits:* {escaped(error.stacks[0])}", MAX_SECTION)))
        if len(error.stacks) > 1:
            listed = [clip(line, 200) for line in error.stacks[1 : 1 + STACK_LINES]]
            blocks.append(section("*Stacks (py-spy)*\n" + code(listed)))
    if error.hint:
        blocks.append(section(f"*Hint:* {escaped(error.hint)}"))
    return blocks


def update_note(error: FirstError) -> str:
    """What an update to the first error above changes (the wire's `update`; today only a later OOM)."""
    if error.secondary_oom:
        return f"the first error in `{error.phase}` above stands: an out-of-memory error followed it, not its cause"
    return f"the first error in `{error.phase}` above, restated by the analyzer"


def checklist_line(check: Check, evidence_chars: int | None = None) -> str:
    evidence = clip(check.evidence, evidence_chars) if evidence_chars else check.evidence
    mark = CHECK_MARK.get(check.state, PENDING_MARK)  # unset: pending
    return f"{mark} *{escaped(check.item)}*" + (f" — {escaped(evidence)}" if evidence else "")


def proxy_note(source: str, proxies: Iterable[tuple[str, str]], line: str) -> str:
    """How the terminal labels a proxy launch as it starts; `proxies`: (id, what it removes)."""
    used = list(proxies)
    ids, removes = " + ".join(p for p, _ in used), "; no ".join(r for _, r in used)
    return f"proxy launch: `{escaped(clip(f'{source}: {ids} (no {removes}) — {line}', 2800))}`"


def proxy_label(source: str, proxies: Iterable[tuple[str, str]]) -> str:
    """A proxy launch in a stage's message: where and which proxies, not the whole command again."""
    return f"`{escaped(source)}` ({escaped(' + '.join(p for p, _ in proxies))})"


def ladder_summary(steps: Iterable[LadderStep]) -> Block:
    """The ladder in one block: a line per step that ran, the steps that did not apply named together; a
    failure's error line is the stage's first error, shown once below."""
    lines, moot = [], []
    for step in steps:
        if step.outcome == LadderOutcome.NOT_APPLICABLE and step.wire.as_written:  # not needed, and why
            lines.append(f"➖ *{escaped(step.wire.title or step.step)}*: {escaped(step.detail)}")
            continue
        if step.outcome == LadderOutcome.NOT_APPLICABLE:
            moot.append(step.wire.title or step.step)
            continue
        added = f" — adds `{escaped(clip(' '.join(step.wire.added), 300))}`" if step.wire.added else ""
        how = "relaunched" if step.relaunched else "same server"
        failed = f" in `{escaped(step.phase)}` [{escaped(step.category)}]" if step.signature else ""
        lines.append(
            f"🪜 *{escaped(step.wire.title or step.step)}*: `{escaped(step.outcome or '')}`{failed} ({how}){added}"
        )
    if moot:
        lines.append(f"➖ not applicable (the deployment sets none of their flags): {escaped(', '.join(moot))}")
    return section(clip("\n".join(lines), MAX_SECTION), "ladder_steps")


def artifact_note(artifact: pb.Artifact) -> str:
    """A one-line artifact as it reads in a message; anything bigger is named (it goes to a file)."""
    if is_file(artifact):
        size = len(artifact.content)
        return f"recorded {escaped(artifact.name)} ({size} bytes; `k3repro show RUN --json` prints it)"
    return f"{escaped(artifact.name.replace('_', ' '))}: `{escaped(clip(artifact.content, 2800))}`"


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


def ladder_block(step: LadderStep) -> Block:
    return section(
        f"🪜 *ladder · {escaped(step.step)}*: `{escaped(step.outcome or '')}` {escaped(step.detail)}".rstrip()
    )


def verdict(view: RunRecord, finished: Finished) -> Message:
    status, decision = finished.status, finished.decision
    minimal = view.artifacts.get(MINIMAL, "")
    return fit(
        escaped(f"{decision or status}: {clip(finished.summary, 300)}"),
        verdict_blocks(view.run_id, view.cluster, finished, minimal),
    )


def verdict_blocks(run_id: str, cluster: str, finished: Finished, minimal: str = "") -> list[Block]:
    """The run's last message; a minimize run's (`minimal`: its result) ends with the command that fails."""
    status, decision = finished.status, finished.decision
    title = f"*Verdict: {escaped(decision)}*" if decision else f"*Run {escaped(status or '')}*"
    if minimal and not decision and status == RunStatus.COMPLETED:
        title = "*Minimize result*"
    mark = DECISION_MARK[decision] if decision else RUN_MARK[RunState(status)] if status else "•"
    where = f" on *{escaped(cluster)}*" if cluster else ""
    blocks = [section(f"{mark} {title} · run `{escaped(run_id)}`{where}", "verdict")]
    if finished.headline:
        blocks.append(section(f"*{escaped(finished.headline)}*", "verdict_line"))
    if minimal and finished.summary == "every stage succeeded":  # the result below says what it found
        return blocks + minimal_blocks(minimal)
    if finished.summary and not finished.headline:  # the verdict line says what the summary would
        blocks.append(section(escaped_but_mentions(finished.summary)))
    reasons = [reason for reason in finished.reasons if reason != finished.summary]
    if reasons:
        blocks.append(section("\n".join(f"• {escaped_but_mentions(reason)}" for reason in reasons)))
    return blocks + (minimal_blocks(minimal) if minimal else [])


def minimal_blocks(content: str) -> list[Block]:
    """A minimize run's result: the one line that fails, what was shown irrelevant, what the search cost."""
    result = json.loads(content)
    flags, irrelevant, failure = result["flags"], result["irrelevant"], result["failure"]
    lines = [
        f"*1-minimal failing command* ({len(flags)} of {len(flags) + len(irrelevant)} flags beyond the essentials; "
        f"fails in `{escaped(failure['phase'])}` ({escaped(failure['category'])}) with the same first error)",
        code([result["command"]]),
    ]
    if irrelevant:
        lines.append("irrelevant to the failure: " + " ".join(f"`{escaped(flag)}`" for flag in irrelevant))
    if result["unresolved_removals"]:
        lines.append(
            "taking these away was unresolved (vLLM refused, or another failure): "
            + " ".join(f"`{escaped(flag)}`" for flag in result["unresolved_removals"])
        )
    caveats = [] if result["confirmed_on_real"] else ["NOT confirmed on the real configuration"]
    caveats += [] if result["one_minimal"] else ["the search stopped at its test limit: not proven 1-minimal"]
    lines.append(
        f"{len(result['tests'])} flag sets tested, {result['launches']} launches, confidence {result['confidence']:.2f}"
        + "".join(f" · {caveat}" for caveat in caveats)
    )
    return [section(clip("\n".join(lines), MAX_SECTION), "minimal")]


def problem(view: RunRecord) -> Message:
    text = f"⚠️ *Run {escaped(view.status)}* — {escaped(clip(view.problem, 2800))}"
    return fit(escaped(f"run {view.run_id}: {view.status}"), [section(text)])


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text}


class EventBlocks:
    """The live stream of a run as blocks, event by event (what the terminal prints as it happens), from the
    facts its record folds in. A first error already shown in full (a repeat attempt, a ladder step reproducing
    it) is shown again in one line."""

    def __init__(self, *, logs: bool = False) -> None:
        self.logs = logs
        self.record = RunRecord("")

    def of(self, event: pb.RunEvent) -> list[Block]:
        """The blocks of one event; [] for what a reader does not need (heartbeats, engine logs by default)."""
        fact = self.record.apply(event)
        if isinstance(fact, StageStarted):
            return [context(f"▶ *{escaped(fact.stage)}*" + (f" — {escaped(fact.detail)}" if fact.detail else ""))]
        if isinstance(fact, StageResult):
            return [stage_head(fact)]
        if isinstance(fact, PhaseReached):
            return [context(f"phase `{escaped(fact.phase)}`")]
        if isinstance(fact, FirstError) and fact.update:
            return [context(escaped(update_note(fact)))]
        if isinstance(fact, FirstError) and fact.repeat:
            return [context(escaped(f"the same first error again in `{fact.phase}` (shown above)"))]
        if isinstance(fact, FirstError):
            return first_error_blocks(fact)
        if isinstance(fact, Check):
            return [section(checklist_line(fact))]
        if isinstance(fact, LadderStep):
            return [ladder_block(fact)]
        if isinstance(fact, pb.RequestResult):
            return [context(escaped(line)) for line in request_lines(fact)]
        if isinstance(fact, pb.Artifact):
            return [context(artifact_note(fact))]
        if isinstance(fact, pb.LaunchStarted) and fact.proxies:
            return [context(proxy_note(fact.source, ((p.id, p.removes) for p in fact.proxies), fact.line))]
        if isinstance(fact, pb.LogChunk) and self.logs:
            return [section(f"log `{escaped(fact.source)}`\n" + code(list(fact.lines)))]
        if isinstance(fact, Finished):
            return verdict_blocks(event.run_id, "", fact, self.record.artifacts.get(MINIMAL, ""))
        return []
