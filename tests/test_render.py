"""The terminal prints what Slack gets (bot/rich.py: one structure, rendered as mrkdwn or as text), and a
run's events as its live stream."""

from __future__ import annotations

from bot import blocks, rich
from bot.record import RunRecord, StageResult, fact_of
from bot.render import TextRenderer
from protos import runner_pb2 as pb

ERROR = pb.FirstError(
    phase=pb.PHASE_GPU_DETECT,
    category=pb.ERROR_CATEGORY_NCCL_COMM,
    line="RuntimeError: NCCL error: unhandled system error",
    context=['  File "pynccl.py", line 1', "RuntimeError: NCCL error: unhandled system error"],
    signature="gpu_detect:nccl_comm:RuntimeError: NCCL error: unhandled system error",
    hint="Rerun with NCCL_DEBUG=INFO.",
)


def test_one_structure_reads_as_mrkdwn_in_slack_and_as_text_in_the_terminal() -> None:
    said: list[rich.Item] = [
        blocks.section(
            rich.bold("bold"), " and ", rich.code("code"), " for ", rich.mention("U123"), "\n", rich.fence(["a", "b"])
        ),
        rich.Fields((rich.Field("Phase", rich.text("gpu_detect")), rich.Field("OOM", rich.text("no")))),
        blocks.context("ctx <#C1|incidents> & *not bold*"),
        rich.SlackOnly(
            {"type": "actions", "elements": [{"type": "button", "text": {"type": "plain_text", "text": "Cancel"}}]}
        ),
    ]
    assert rich.lines(said) == [
        "bold and code for @U123",
        "| a",
        "| b",
        "Phase: gpu_detect · OOM: no",
        "ctx <#C1|incidents> & *not bold*",
    ]
    slack = rich.mrkdwn_blocks(said)
    assert slack[0]["text"]["text"] == "*bold* and `code` for <@U123>\n```a\nb```"
    assert slack[1]["fields"] == [
        {"type": "mrkdwn", "text": "*Phase*\ngpu_detect"},
        {"type": "mrkdwn", "text": "*OOM*\nno"},
    ]
    assert slack[2]["elements"][0]["text"] == "ctx &lt;#C1|incidents&gt; &amp; *not bold*"
    assert slack[3]["type"] == "actions"


def test_a_product_like_2x4_keeps_its_star() -> None:
    assert rich.lines([blocks.section("weights 2*4 GiB, ", rich.bold("not"), " bold: a*b")]) == [
        "weights 2*4 GiB, not bold: a*b"
    ]


def test_the_terminal_shows_the_stage_message_slack_posts() -> None:
    view = RunRecord("r1", "cluster-a", "gpu-a1", "img", "U1", stage="minimal_launch")
    view.apply(pb.RunEvent(first_error=ERROR))
    finished = pb.StageFinished(
        stage=pb.STAGE_MINIMAL_LAUNCH, status=pb.STAGE_STATUS_FAILED, summary="failed in gpu_detect (nccl_comm)"
    )
    slack = rich.lines(blocks.stage_said(view, _result(finished)))
    renderer = TextRenderer()
    printed = renderer.lines(pb.RunEvent(first_error=ERROR)) + renderer.lines(pb.RunEvent(stage_finished=finished))
    body = [line.split("] ", 1)[1] if line.startswith("[") else line.strip() for line in printed]
    assert slack == [body[-1], *(line.strip() for line in body[:-1])]  # the same lines: head, then the error
    assert "🔥 First error" in slack and "| RuntimeError: NCCL error: unhandled system error" in slack
    assert (
        "Phase: gpu_detect · Category: nccl_comm · Secondary OOM: no" in slack
        and "Hint: Rerun with NCCL_DEBUG=INFO." in slack
    )


def test_a_first_error_shown_in_full_is_repeated_in_one_line() -> None:
    renderer = TextRenderer()
    first = renderer.lines(pb.RunEvent(first_error=ERROR))
    again = renderer.lines(pb.RunEvent(first_error=ERROR))
    assert len(first) > 3 and len(again) == 1
    assert again[0].endswith("the same first error again in gpu_detect (shown above)")  # the line once


def test_logs_and_heartbeats_are_left_out_unless_asked_for() -> None:
    chunk = pb.RunEvent(log_chunk=pb.LogChunk(source="minimal_launch", lines=["INFO 1", "INFO 2"]))
    assert TextRenderer().lines(chunk) == [] and TextRenderer().lines(pb.RunEvent(heartbeat=pb.Heartbeat())) == []
    shown = TextRenderer(logs=True).lines(chunk)
    assert shown[0].endswith("log minimal_launch") and [line.strip() for line in shown[1:]] == ["| INFO 1", "| INFO 2"]


def test_a_request_line_is_the_same_in_slack_and_in_the_terminal() -> None:
    result = pb.RequestResult(
        attempt=1, http_status=200, finish_reason="stop", prompt_tokens=12, completion_tokens=48, max_tokens=64,
        latency_s=0.5, gpu_memory_before_mib=1000, gpu_memory_after_mib=1200, warnings=["WARNING guided_json ignored"],
    )  # fmt: skip
    view = RunRecord("r1", "cluster-a", "gpu-a1", "img", "U1", stage="single_request")
    view.apply(pb.RunEvent(request_result=result))
    finished = pb.StageFinished(stage=pb.STAGE_SINGLE_REQUEST, status=pb.STAGE_STATUS_OK, summary="3/3 answered")
    slack = rich.lines(blocks.stage_said(view, _result(finished)))
    printed = [line.split("] ", 1)[-1].strip() for line in TextRenderer().lines(pb.RunEvent(request_result=result))]
    expected = (
        "request #1: HTTP 200 · finish stop · 12 prompt → 48 completion tokens (max_tokens 64) · 0.50 s · "
        "GPU memory 1,000 → 1,200 MiB · 1 warning(s)"
    )
    assert printed == [expected, "warning: WARNING guided_json ignored"]
    assert slack[1:] == [f"| {expected}", "|   warning: WARNING guided_json ignored"]


def test_a_proxy_launch_is_labelled_in_its_stage_message_and_in_the_terminal() -> None:
    dummy = pb.ProxyUsed(id="dummy_weights", removes="reading the weights")
    real = pb.LaunchStarted(source="ladder/long_input", line="vllm serve m --port 1", number=2)
    proxy = pb.LaunchStarted(
        source="ladder/concurrency/proxy", line="vllm serve m --load-format dummy --port 2", proxies=[dummy], number=3
    )
    events = [
        pb.RunEvent(stage_started=pb.StageStarted(stage=pb.STAGE_LADDER)),
        pb.RunEvent(launch_started=real),
        pb.RunEvent(launch_started=proxy),
    ]
    view, renderer = RunRecord("r1"), TextRenderer()
    printed = [line for event in events for line in renderer.lines(event) if "launch" in line]
    for event in events:
        view.apply(event)
    finished = pb.StageFinished(stage=pb.STAGE_LADDER, status=pb.STAGE_STATUS_OK, summary="every step held")
    slack = rich.lines(blocks.stage_said(view, _result(finished)))
    # the stage's message names each proxy launch by a short label, not its command again
    assert slack[1:] == ["proxy launches: ladder/concurrency/proxy (dummy_weights)"]  # the real one is not named
    label = (
        "proxy launch: ladder/concurrency/proxy: dummy_weights (no reading the weights) — "
        "vllm serve m --load-format dummy --port 2"
    )
    assert [line.split("] ", 1)[-1].strip() for line in printed] == [label]  # the terminal shows it as it starts
    assert [span.proxy for span in view.launches] == [False, True]


def _result(finished: pb.StageFinished) -> StageResult:
    result = fact_of(pb.RunEvent(stage_finished=finished))
    assert isinstance(result, StageResult)
    return result


def test_the_terminal_prints_a_runs_text_as_it_was_where_slack_gets_it_escaped() -> None:
    """No mrkdwn is read back: marks, fences and carriage returns in an engine's text are printed as they came."""
    said = [
        blocks.section(rich.bold("h *x* <b>"), "\n", rich.fence(["```x``` &", "bar\r50%"])),
        rich.Section(rich.mentioning("cancelled by <@U1>, not <!channel>")),
    ]
    assert rich.lines(said) == ["h *x* <b>", "| ```x``` &", "| bar\r50%", "cancelled by @U1, not <!channel>"]
    assert [block["text"]["text"] for block in rich.mrkdwn_blocks(said)] == [
        "*h *x* &lt;b&gt;*\n```'''x''' &amp;\nbar\r50%```",
        "cancelled by <@U1>, not &lt;!channel&gt;",
    ]


def test_a_link_a_channel_and_a_refusal_render_for_each_surface_and_cannot_break_out() -> None:
    said = [
        rich.Section(rich.text(rich.link("thread in #C1 <!here>", "https://t.slack.com/archives/C1/p1|x>y"))),
        rich.Section(rich.mentioning("only from <#C-OPS>, by <@U-OPS>; <#not a channel> <!channel>")),
        rich.Context(rich.text(rich.italic("shown to operators"))),
        rich.Section(rich.text("launches ", rich.code("vllm serve m --chat-template '`x`'"))),
    ]
    assert rich.lines(said) == [
        "thread in #C1 <!here> (https://t.slack.com/archives/C1/p1|x>y)",
        "only from #C-OPS, by @U-OPS; <#not a channel> <!channel>",
        "shown to operators",
        "launches vllm serve m --chat-template '`x`'",
    ]
    slack = rich.mrkdwn_blocks(said)
    assert slack[0]["text"]["text"] == "<https://t.slack.com/archives/C1/p1%7Cx&gt;y|thread in #C1 &lt;!here&gt;>"
    assert slack[1]["text"]["text"] == "only from <#C-OPS>, by <@U-OPS>; &lt;#not a channel&gt; &lt;!channel&gt;"
    assert slack[2]["elements"][0]["text"] == "_shown to operators_"
    assert slack[3]["text"]["text"] == "launches `vllm serve m --chat-template ''x''`"  # a backtick cannot end it
