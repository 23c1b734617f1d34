"""Block Kit for a run's thread, kept within Slack's limits; whatever does not fit goes to a file.

Limits (docs.slack.dev, and bolt-js #2509 for the undocumented aggregate): ≤ 50 blocks, section text
≤ 3000 characters, about 12 000 characters of blocks per message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bot.render import request_notes
from bot.slack.view import RunView
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, to_id

MAX_BLOCKS = 50
MAX_SECTION = 3000
MAX_MESSAGE = 12_000
EVIDENCE_CHARS = 240
CONTEXT_LINES = 6

Block = dict[str, Any]
ACTION_RERUN = "k3repro_rerun_isolated"
ACTION_CANCEL = "k3repro_cancel"
METADATA_EVENT = "k3repro_run"

RUN_MARK = {"running": "🔄", "completed": "✅", "cancelled": "⊘", "error": "⚠️", "lost": "⚠️"}
STAGE_MARK: dict[int, str] = {
    pb.STAGE_STATUS_OK: "✅",
    pb.STAGE_STATUS_FAILED: "❌",
    pb.STAGE_STATUS_SKIPPED: "⏭",
    pb.STAGE_STATUS_CANCELLED: "⊘",
}
DECISION_MARK = {"fix": "🛠", "isolate": "🧪", "continue": "🔎"}
CHECK_MARK: dict[int, str] = {pb.CHECKLIST_STATE_HOLDS: "✅", pb.CHECKLIST_STATE_FAILS: "❌"}
PENDING_MARK = "⬜"


@dataclass(frozen=True)
class Message:
    text: str  # the notification / accessibility fallback
    blocks: list[Block]
    overflow: str = ""  # the full text when the blocks had to be shortened: attach it as a file

    def args(self) -> dict[str, Any]:
        return {"text": self.text, "blocks": self.blocks}


def section(text: str, block_id: str | None = None) -> Block:
    block: Block = {"type": "section", "text": {"type": "mrkdwn", "text": text}}
    if block_id:
        block["block_id"] = block_id
    return block


def context(text: str) -> Block:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def code(lines: list[str]) -> str:
    return "```" + "\n".join(line.replace("```", "'''") for line in lines) + "```"


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plain(blocks: list[Block]) -> str:
    """The text of blocks, for a file when they do not fit (and for anything that cannot show Block Kit)."""
    parts: list[str] = []
    for block in blocks:
        texts = [block.get("text") or {}, *block.get("fields", []), *block.get("elements", [])]
        parts += [t["text"] for t in texts if isinstance(t, dict) and isinstance(t.get("text"), str)]
    return "\n".join(parts)


SHORTENED = {
    "type": "context",
    "elements": [{"type": "mrkdwn", "text": "_Shortened to fit Slack; the full text is in the attached file._"}],
}


def fit(text: str, blocks: list[Block]) -> Message:
    """Shortens what is too long for Slack; the message then says so and carries its full text for a file."""
    full = plain(blocks)
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


def metadata(view: RunView) -> dict[str, Any]:
    return {"event_type": METADATA_EVENT, "event_payload": {"run_id": view.run_id, "cluster": view.cluster}}


def card(view: RunView) -> Message:
    """The parent message in the channel: what runs where, and its state."""
    mark = RUN_MARK.get(view.status, "•")
    doing = f"stage `{view.stage}`" + (f" · phase `{view.phase}`" if view.phase else "") if view.stage else ""
    state = view.status + (f" — {view.decision}" if view.decision else "")
    fields = [
        ("Cluster", view.cluster),
        ("Runner", view.host + (f" ({view.runner})" if view.host else "") if view.host else view.runner),
        ("Image", f"`{view.image}`"),
        ("Digest", f"`{view.digest}`" if view.digest else "not known yet"),
        ("Status", f"{mark} {state}"),
        ("Started by", f"<@{view.requested_by}>" if view.requested_by else "-"),
    ]
    blocks: list[Block] = [
        section(f"*k3repro run* `{view.run_id}` on *{view.cluster}*", "title"),
        {
            "type": "section",
            "block_id": "facts",
            "fields": [{"type": "mrkdwn", "text": f"*{name}*\n{clip(value, 1900)}"} for name, value in fields],
        },
        context(clip(doing or view.problem or "details in the thread", 2000)),
    ]
    buttons: list[Block] = [
        {"type": "button", "action_id": ACTION_RERUN, "text": _plain("Rerun on isolated node"), "value": view.run_id}
    ]
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
    return fit(f"{mark} k3repro run {view.run_id} on {view.cluster}: {state}", blocks)


def checklist(view: RunView) -> Message:
    """The live checklist: always the same twelve blocks, so every chat.update keeps the layout."""
    where = (
        f"stage `{view.stage}`" + (f" · phase `{view.phase}`" if view.phase else "")
        if view.stage
        else f"run {view.status}"
    )
    held = sum(1 for state, _ in view.checklist.values() if state == pb.CHECKLIST_STATE_HOLDS)
    blocks = [section(f"*Checklist* · {held}/{len(CHECKLIST_IDS)} hold · {where}", "now")]
    for item in CHECKLIST_IDS:
        state, evidence = view.checklist.get(item, (pb.CHECKLIST_STATE_UNSPECIFIED, ""))
        line = f"{CHECK_MARK.get(state, PENDING_MARK)} *{item}*" + (
            f" — {clip(evidence, EVIDENCE_CHARS)}" if evidence else ""
        )
        blocks.append(section(line, item))
    blocks.append(context(f"run `{view.run_id}` · updated as the run goes"))
    return fit(f"Checklist: {held}/{len(CHECKLIST_IDS)} hold · {where}", blocks)


def stage_result(view: RunView, finished: pb.StageFinished) -> Message:
    """One message per finished stage; a failure shows the first error, its context, the hint and the OOM call."""
    stage = to_id(pb.Stage, finished.stage) or "run"
    mark = STAGE_MARK.get(finished.status, "•")
    blocks = [section(f"{mark} *{stage}* — {clip(finished.summary, 2800)}", "result")]
    blocks += [section(f"{a.name.replace('_', ' ')}: `{clip(a.content, 2800)}`") for a in view.notes.get(stage, [])]
    error = view.first_errors.get(stage)
    if error is not None and finished.status == pb.STAGE_STATUS_FAILED:
        oom = "yes — an OOM was seen, but it is not the cause" if error.secondary_oom else "no"
        blocks.append(
            {
                "type": "section",
                "block_id": "first_error",
                "fields": [
                    {"type": "mrkdwn", "text": f"*Phase*\n{to_id(pb.Phase, error.phase)}"},
                    {"type": "mrkdwn", "text": f"*Category*\n{to_id(pb.ErrorCategory, error.category)}"},
                    {"type": "mrkdwn", "text": f"*Secondary OOM*\n{oom}"},
                ],
            }
        )
        blocks.append(section("*First error*\n" + code([error.line])))
        if error.context:
            blocks.append(section("*Context*\n" + code(list(error.context[:CONTEXT_LINES]))))
        if error.hint:
            blocks.append(section(f"*Hint* {error.hint}"))
    if stage == "single_request":
        blocks += [section(code([_request_line(r) for r in view.requests]))] if view.requests else []
    return fit(f"{mark} {stage}: {clip(finished.summary, 300)}", blocks)


def ladder_step(step: pb.LadderStepResult) -> Message:
    name, outcome = to_id(pb.LadderStepId, step.step), to_id(pb.LadderOutcome, step.outcome)
    return fit(f"ladder {name}: {outcome}", [section(f"🪜 *ladder · {name}*: `{outcome}` {step.detail}".rstrip())])


def verdict(view: RunView, finished: pb.RunFinished) -> Message:
    status, decision = to_id(pb.RunStatus, finished.status), to_id(pb.Decision, finished.decision)
    title = f"*Verdict: {decision}*" if decision else f"*Run {status}*"
    mark = DECISION_MARK.get(decision) or RUN_MARK.get(status, "•")
    blocks = [section(f"{mark} {title} · run `{view.run_id}` on *{view.cluster}*", "verdict")]
    if finished.summary:
        blocks.append(section(finished.summary))
    reasons = [reason for reason in finished.reasons if reason != finished.summary]
    if reasons:
        blocks.append(section("\n".join(f"• {reason}" for reason in reasons)))
    return fit(f"{decision or status}: {clip(finished.summary, 300)}", blocks)


def problem(view: RunView) -> Message:
    return fit(f"run {view.run_id}: {view.status}", [section(f"⚠️ *Run {view.status}* — {clip(view.problem, 2800)}")])


def _request_line(r: pb.RequestResult) -> str:
    answer = f"HTTP {r.http_status}" if r.http_status else "no answer"
    return (
        f"#{r.attempt} {answer} · finish {r.finish_reason or '-'} · {r.prompt_tokens} → {r.completion_tokens} "
        f"tokens (max {r.max_tokens}) · {r.latency_s:.2f} s{request_notes(r)}" + (f" · {r.error}" if r.error else "")
    )


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text}
