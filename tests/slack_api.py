"""A local Slack for tests: the Web API methods the bot uses, file uploads, and a Socket Mode WebSocket.

It binds port 0, records every call with its body, keeps the messages as Slack would show them (after
every update, with their metadata, found again by conversations.history/replies; files with their shares, by
files.info), and answers with faults on request, for one method or all: 429 with Retry-After, 5xx, a hang (a
time-out), a slow answer, or a death mid-call (the call takes effect, the connection drops before the answer),
each for a number of calls, a while, or every Nth call.
Plus helpers that sign requests the way Slack does and build a bot config that points at it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from bot.config import BotConfig, SlackConfig
from bot.web import SLACK_PATH, Served, serving
from kernel.tls import DevCerts
from protos.vocab import CHECKLIST_IDS
from tests.k3fixtures import KIMI_LAUNCH, SIM_SPEED, bot_config, runner_data, running_runner

SIGNING_SECRET = "test-signing-secret"
BOT_TOKEN = "xoxb-test-token"
APP_TOKEN = "xapp-test-token"
TEAM_DOMAIN = "k3lab"


@dataclass
class Call:
    method: str
    body: dict[str, Any]
    status: int
    at: float = field(default_factory=time.monotonic)


HANG, SLOW, DIE = 0, 1, 2  # fault "statuses" that are not HTTP answers


@dataclass
class Fault:
    """Answer calls of `method` ("*": any) with `status` `times` times, or until a deadline, on every
    `every`th call of each method (counted per method, so how lanes interleave cannot starve one).

    HANG waits `retry_after` seconds (longer than the client's time-out) and answers 504; SLOW does the call
    and answers `retry_after` seconds later (the window a crash makes a post land unrecorded); DIE does the call
    and drops the connection without answering."""

    method: str
    status: int
    retry_after: float = 1.0
    times: int | None = 1
    until: float | None = None
    every: int = 1
    seen: dict[str, int] = field(default_factory=dict)

    def matches(self, method: str) -> bool:
        active = (self.times is None or self.times > 0) and (self.until is None or time.monotonic() < self.until)
        if not (active and self.method in (method, "*")):
            return False
        self.seen[method] = self.seen.get(method, 0) + 1
        return self.seen[method] % self.every == 0


class SlackApi:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.messages: dict[str, dict[str, Any]] = {}  # ts -> the message as it stands
        self.files: list[dict[str, Any]] = []
        self.groups: dict[str, list[str]] = {}
        self.faults: list[Fault] = []
        self.envelopes_acked: dict[str, dict[str, Any]] = {}
        self.answering = 0  # SLOW calls that took effect and are not answered yet
        self._ts = itertools.count(1)
        self._last_ts = 0  # microseconds of the last message ts
        self._uploads: dict[str, bytes] = {}
        self._sockets: list[web.WebSocketResponse] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    async def start(self) -> SlackApi:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/socket", self._socket)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        for ws in self._sockets:
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- faults and queries ---

    def fail(
        self,
        method: str,
        status: int,
        *,
        times: int | None = 1,
        for_s: float | None = None,
        retry_after: float = 1.0,
        every: int = 1,
    ) -> Fault:
        until = time.monotonic() + for_s if for_s is not None else None
        fault = Fault(method, status, retry_after, None if for_s is not None else times, until, every)
        self.faults.append(fault)
        return fault

    def posted(self) -> list[dict[str, Any]]:
        """Every message as it stands, oldest first."""
        return list(self.messages.values())

    def say(self, channel: str, text: str, thread_ts: str | None = None) -> str:
        """A person's message in the channel (or a thread of it), as Slack would hold it; its ts."""
        body = {"channel": channel, "text": text, **({"thread_ts": thread_ts} if thread_ts else {})}
        return str(self._answer("chat.postMessage", body)["ts"])

    def called(self, method: str, status: int | None = 200) -> list[Call]:
        return [c for c in self.calls if c.method == method and (status is None or c.status == status)]

    def thread(self, parent_ts: str) -> list[dict[str, Any]]:
        """The replies of a thread, oldest first, as they stand now."""
        return [m for m in self.messages.values() if m.get("thread_ts") == parent_ts]

    async def wait_for(self, check: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if result := check():
                return result
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what or check}; calls: {[c.method for c in self.calls]}")

    # --- Socket Mode ---

    async def send_envelope(self, kind: str, payload: dict[str, Any], envelope_id: str, **extra: Any) -> None:
        await self.wait_for(lambda: self._sockets, what="a Socket Mode connection")
        envelope = {"envelope_id": envelope_id, "type": kind, "payload": payload, "accepts_response_payload": True}
        await self._sockets[-1].send_str(json.dumps({**envelope, **extra}))

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1}))
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                data = json.loads(message.data)
                self.envelopes_acked[data["envelope_id"]] = data.get("payload") or {}
        return ws

    # --- the Web API ---

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        body = await _body(request)
        fault = next((f for f in self.faults if f.matches(method)), None)
        if fault is not None and fault.times is not None:
            fault.times -= 1
        if fault is not None and fault.status == HANG:  # hang past the client's time-out, then give up
            self.calls.append(Call(method, body, 0))
            await asyncio.sleep(fault.retry_after)
            return web.json_response({"ok": False, "error": "request_timeout"}, status=504)
        if fault is not None and fault.status == SLOW:
            self.calls.append(Call(method, body, SLOW))
            answer = self._answer(method, body)
            self.answering += 1
            try:
                await asyncio.sleep(fault.retry_after)
            finally:
                self.answering -= 1
            return web.json_response({"ok": True, **answer})
        if fault is not None and fault.status == DIE:  # it happens in Slack; the bot never hears so
            self.calls.append(Call(method, body, DIE))
            self._answer(method, body)
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        elif fault is not None:
            self.calls.append(Call(method, body, fault.status))
            headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.status == 429 else {}
            error = "ratelimited" if fault.status == 429 else "fatal_error"
            return web.json_response({"ok": False, "error": error}, status=fault.status, headers=headers)
        if not request.headers.get("Authorization", "").startswith(("Bearer xoxb-", "Bearer xapp-")):
            self.calls.append(Call(method, body, 200))
            return web.json_response({"ok": False, "error": "invalid_auth"})
        self.calls.append(Call(method, body, 200))
        return web.json_response({"ok": True, **self._answer(method, body)})

    def _new_ts(self) -> str:
        """A message ts as Slack makes them: the time it was posted (seconds.micro), unique and increasing."""
        self._last_ts = max(self._last_ts + 1, int(time.time() * 1_000_000))
        return f"{self._last_ts // 1_000_000}.{self._last_ts % 1_000_000:06d}"

    def _answer(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "auth.test":
            return {
                "user_id": "UBOT",
                "bot_id": "BBOT",
                "team_id": "T1",
                "team": "k3lab",
                "url": "https://k3lab.slack.com/",
            }
        if method == "chat.postMessage":
            ts = self._new_ts()
            self.messages[ts] = {**body, "ts": ts, "updates": 0}
            return {"channel": body["channel"], "ts": ts, "message": {"text": body.get("text", "")}}
        if method == "chat.update":
            message = self.messages[body["ts"]]
            message.update({k: v for k, v in body.items() if k != "ts"}, updates=message["updates"] + 1)
            return {"channel": body["channel"], "ts": body["ts"]}
        if method in ("conversations.history", "conversations.replies"):
            found = [m for m in self.messages.values() if m["channel"] == body["channel"]]
            if method == "conversations.replies":
                found = [m for m in found if body["ts"] in (m["ts"], m.get("thread_ts"))]
            else:
                found = [m for m in found if "thread_ts" not in m or m.get("reply_broadcast")][::-1]
            if body.get("oldest"):  # exclusive, as Slack's
                found = [m for m in found if float(m["ts"]) > float(body["oldest"])]
            # a page at a time, as Slack answers: `limit` (its defaults), then the cursor the last page gave
            limit = int(body.get("limit") or (1000 if method == "conversations.replies" else 100))
            start = int(base64.b64decode(body["cursor"]).decode().removeprefix("next:")) if body.get("cursor") else 0
            page, more = found[start : start + limit], start + limit < len(found)
            return {
                "messages": [{"ts": m["ts"], "text": m.get("text", ""), "metadata": m.get("metadata")} for m in page],
                "has_more": more,
                "response_metadata": {"next_cursor": base64.b64encode(f"next:{start + limit}".encode()).decode()}
                if more
                else {"next_cursor": ""},
            }
        if method == "files.info":
            shared = [f for f in self.files if f["id"] == body["file"]]
            shares = {f["channel"]: [{"ts": f["ts"], "thread_ts": f["thread_ts"]}] for f in shared}
            return {"file": {"id": body["file"], "shares": {"public": shares} if shares else {}}}
        if method == "chat.postEphemeral":
            return {"message_ts": f"1700000001.{next(self._ts):06d}"}
        if method == "usergroups.users.list":
            return {"users": self.groups.get(body["usergroup"], [])}
        if method == "files.getUploadURLExternal":
            file_id = f"F{next(self._ts):05d}"
            return {"upload_url": f"http://127.0.0.1:{self.port}/upload/{file_id}", "file_id": file_id}
        if method == "files.completeUploadExternal":
            files = json.loads(body["files"]) if isinstance(body["files"], str) else body["files"]
            for f in files:
                data = self._uploads[f["id"]]
                self.files.append(
                    {
                        **f,
                        "channel": body.get("channel_id"),
                        "thread_ts": body.get("thread_ts"),
                        "ts": self._new_ts(),
                        "data": data,  # as uploaded; "content": a text file's text
                        "content": data.decode("utf-8", "replace"),
                    }
                )
            return {"files": [{"id": f["id"], "title": f.get("title", "")} for f in files]}
        if method == "apps.connections.open":
            return {"url": f"ws://127.0.0.1:{self.port}/socket"}
        return {}

    async def _upload(self, request: web.Request) -> web.Response:
        data = await request.read()
        self._uploads[request.match_info["file_id"]] = data
        self.calls.append(Call("upload", {"file_id": request.match_info["file_id"], "size": len(data)}, 200))
        return web.Response(text=f"OK - {len(data)}")


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        data: dict[str, Any] = await request.json()
        return data
    form = await request.post()
    return {**dict(request.query), **{key: str(value) for key, value in form.items()}}


# --- the bot's side ---


@contextlib.asynccontextmanager
async def slack_bot(
    certs: DevCerts,
    tmp_path: Path,
    api: SlackApi,
    *,
    scenario: str = "demo",
    speed: float = SIM_SPEED,
    launch: str = KIMI_LAUNCH,
    **settings: Any,
) -> AsyncIterator[Served]:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario=scenario, speed=speed)) as daemon:
        bot = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"], launch=launch)
        config = slack_config(bot, api, **settings)
        async with serving(config, port=0) as served:
            yield served


async def post(served: Served, body: str, headers: dict[str, str]) -> tuple[int, str]:
    url = f"http://127.0.0.1:{served.port}{SLACK_PATH}"
    headers = {"Content-Type": "application/x-www-form-urlencoded", **headers}
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as response:
        return response.status, await response.text()


async def settle(served: Served) -> None:
    """Until every run the bot follows has ended and every write it caused reached Slack."""
    await served.bot.idle()


def block_text(message: dict[str, Any]) -> str:
    return json.dumps(message["blocks"], ensure_ascii=False)


def parent_of(api: SlackApi) -> dict[str, Any] | None:
    return next((m for m in api.messages.values() if m["channel"] == "C-OPS" and "thread_ts" not in m), None)


def slack_config(config: BotConfig, api: SlackApi, **settings: Any) -> BotConfig:
    """`config` with a [slack] table pointing at `api`, fast pacing, and cluster-a operated from C-OPS by U-OPS."""
    slack = SlackConfig(
        bot_token=BOT_TOKEN,
        signing_secret=SIGNING_SECRET,
        api_url=api.url,
        listen="127.0.0.1:0",
        post_interval_s=0.02,
        update_interval_s=0.02,
        timeout_s=1,
    )
    cluster = replace(config.clusters["cluster-a"], channels=("C-OPS",), operators=("U-OPS", "S-SRE"))
    return replace(config, slack=replace(slack, **settings), clusters={"cluster-a": cluster})


def signed(body: str, *, secret: str = SIGNING_SECRET, timestamp: int | None = None, **headers: str) -> dict[str, str]:
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature, **headers}


def command_fields(text: str, *, user: str = "U-OPS", channel: str = "C-OPS", trigger: str = "") -> dict[str, str]:
    """A slash command's payload, as Slack sends it (form-encoded over HTTP, JSON in a Socket Mode envelope)."""
    return {
        "command": "/k3repro",
        "text": text,
        "user_id": user,
        "user_name": user.lower(),
        "channel_id": channel,
        "channel_name": "ops",
        "team_id": "T1",
        "team_domain": TEAM_DOMAIN,
        "api_app_id": "A1",
        "response_url": "https://hooks.slack.invalid/commands/1",
        "trigger_id": trigger or f"trigger-{time.monotonic_ns()}",
    }


def command_body(text: str, **fields: str) -> str:
    return urlencode(command_fields(text, **fields))


def action_payload(
    action_id: str, run_id: str, *, user: str = "U-OPS", channel: str = "C-OPS", trigger: str = ""
) -> dict[str, Any]:
    return {
        "type": "block_actions",
        "user": {"id": user},
        "api_app_id": "A1",
        "team": {"id": "T1", "domain": TEAM_DOMAIN},
        "channel": {"id": channel},
        "trigger_id": trigger or f"trigger-{time.monotonic_ns()}",
        "container": {"type": "message", "channel_id": channel},
        "actions": [{"action_id": action_id, "block_id": "run_actions", "value": run_id, "type": "button"}],
    }


def action_body(payload: dict[str, Any]) -> str:
    return urlencode({"payload": json.dumps(payload)})


def assert_thread_complete(api: SlackApi) -> None:
    """One card, one checklist in its final state, each stage once, the verdict, its two files once."""
    cards = [m for m in api.messages.values() if "thread_ts" not in m]
    assert len(cards) == 1
    parent = cards[0]
    assert "completed" in parent["text"]
    checklist, *stages, verdict = api.thread(parent["ts"])
    assert checklist["text"].startswith("Checklist") and "run completed" in checklist["text"]
    assert [b.get("block_id") for b in checklist["blocks"][1:-1]] == CHECKLIST_IDS
    heads = [s["text"].split(":")[0] for s in stages]
    assert len(heads) == len(set(heads)) and heads[0] == "✅ freeze" and "❌ minimal_launch" in heads
    assert verdict.get("reply_broadcast") and verdict["text"].startswith("continue")
    titles = [f["title"] for f in api.files]
    assert sorted(titles) == ["bundle", "timeline"]  # the run's files, gathered: the picture and the bundle
    assert all(f["thread_ts"] == parent["ts"] for f in api.files)
    keys = [((m.get("metadata") or {}).get("event_payload") or {}).get("k3repro_key") for m in api.thread(parent["ts"])]
    assert all(keys) and len(keys) == len(set(keys))  # nothing posted twice (a card's updates replace its metadata)
