"""vLLM's OpenAI-compatible HTTP API, served by aiohttp on the socket bound during start-up.

Bodies, status codes, error texts and headers follow vLLM 0.33 (FastAPI on uvicorn), including the
uvicorn access log line, so a client or a prober cannot tell it from the real server.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from runner.sim.catalog import Catalog
from runner.sim.datafiles import load
from runner.sim.engine import Engine, EngineDeadError, FaultResponseError, Generation
from runner.sim.facts import VERSION, Facts
from runner.sim.logwriter import LogWriter, Procs
from runner.sim.metrics import CONTENT_TYPE, Metrics
from runner.sim.tokenizer import chat_prompt, detokenize, tokenize

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequestError(Exception):
    """A request vLLM refuses with 400 (or the status given); the message is vLLM's."""

    def __init__(self, key: str, **names: object) -> None:
        super().__init__(key)
        self.key = key
        self.names = names


def _access_logger(log: LogWriter, procs: Procs) -> type[AbstractAccessLogger]:
    template = load("log.toml")["access"]["text"]

    class AccessLogger(AbstractAccessLogger):
        """uvicorn's access line: client address, request line, status and reason phrase."""

        def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "-"
            line = f"{request.method} {request.path_qs} HTTP/{request.version.major}.{request.version.minor}"
            reason = HTTPStatus(response.status).phrase
            text = template.format(client=client, request_line=line, status=response.status, reason=reason)
            log.plain(procs.api, [text], "stdout")

    return AccessLogger


@web.middleware
async def _fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """FastAPI's bodies for unknown paths and methods, where aiohttp would answer in plain text."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return web.json_response({"detail": "Method Not Allowed"}, status=405)


async def _uvicorn_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["server"] = "uvicorn"


class ApiServer:
    def __init__(self, engine: Engine, facts: Facts, catalog: Catalog, log: LogWriter, procs: Procs) -> None:
        self._engine = engine
        self._facts = facts
        self._catalog = catalog
        self._log = log
        self._procs = procs
        self._warned_removed_fields = False
        self._metrics = Metrics(engine, facts.settings.served_model_name, facts.values())
        self._created = int(time.time())
        app = web.Application(middlewares=[_fastapi_errors])
        app.on_response_prepare.append(_uvicorn_headers)
        app.router.add_get("/health", self._health, allow_head=False)
        app.router.add_route("*", "/ping", self._health)
        app.router.add_get("/version", self._version, allow_head=False)
        app.router.add_get("/v1/models", self._models, allow_head=False)
        app.router.add_get("/metrics", self._render_metrics, allow_head=False)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(
            app,
            access_log_class=_access_logger(log, procs),
            access_log=None if facts.settings.disable_access_log else logging.getLogger("uvicorn.access"),
        )

    async def start(self, sock: socket.socket) -> None:
        """Starts accepting on the socket bound at start-up (this is when connects stop being refused)."""
        await self._runner.setup()
        await web.SockSite(self._runner, sock, shutdown_timeout=0.5).start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self._engine.dead.is_set() else 200)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def _models(self, request: web.Request) -> web.Response:
        settings = self._facts.settings
        card = {
            "id": settings.served_model_name,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": settings.model,
            "parent": None,
            "max_model_len": self._facts.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex}",
                    "object": "model_permission",
                    "created": self._created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _render_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def _error(self, key: str, **names: object) -> web.Response:
        status, body = self._catalog.http_body(key, **names)
        return web.json_response(body, status=status)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body, generation = await self._accept(request, chat=chat)
        except BadRequestError as refused:
            return self._error(refused.key, **refused.names)
        if self._engine.dead.is_set():
            return self._error("engine_dead")
        if body.get("stream") is True:
            return await self._stream(request, body, generation, chat=chat)
        try:
            tokens = [token async for token in self._engine.run(generation)]
        except EngineDeadError:
            return self._error("engine_dead")
        except FaultResponseError as fault:
            return self._error("fault_response", message=str(fault))
        text = detokenize(tokens)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": generation.finish_reason}
        if chat:
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning_content": None,
            }
        else:
            choice["text"] = text
        choice["stop_reason"] = None
        payload = {
            **self._head(chat, streaming=False),
            "choices": [choice],
            "usage": _usage(generation),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
        return web.json_response(payload)

    def _head(self, chat: bool, *, streaming: bool) -> dict[str, Any]:
        kind = ("chat.completion" if chat else "text_completion") + (".chunk" if streaming and chat else "")
        prefix = "chatcmpl" if chat else "cmpl"
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self._facts.settings.served_model_name,
        }

    async def _accept(self, request: web.Request, *, chat: bool) -> tuple[dict[str, Any], Generation]:
        """The validated request: its body and what the engine is to generate for it."""
        try:
            body = await request.json()
        except ValueError:
            raise BadRequestError("invalid_request", detail="Invalid JSON body") from None
        if not isinstance(body, dict):
            raise BadRequestError("invalid_request", detail="The request body must be a JSON object")
        self._warn_removed_fields(body)
        served = self._facts.settings.served_model_name
        if body.get("model") not in (None, served):
            raise BadRequestError("model_not_found", model=body["model"])
        prompt = self._chat_prompt(body) if chat else _completion_prompt(body)
        limit = self._facts.max_model_len
        if len(prompt) > limit:
            raise BadRequestError("prompt_too_long", max_model_len=limit, prompt_tokens=len(prompt))
        default = limit - len(prompt) if chat else 16  # vLLM: chat fills the context, completions 16
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens")
        max_tokens = default if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequestError("invalid_request", detail=f"max_tokens must be at least 1, got {max_tokens}")
        if len(prompt) + max_tokens > limit:
            raise BadRequestError(
                "max_tokens_too_large", max_tokens=max_tokens, max_model_len=limit, prompt_tokens=len(prompt)
            )
        return body, self._engine.plan(prompt, max_tokens, tools=bool(body.get("tools")))

    def _warn_removed_fields(self, body: dict[str, Any]) -> None:
        """vLLM's warning_once for removed guided-decoding fields (ignored: the output is unconstrained)."""
        line = load("log.toml")["removed_request_fields"]
        removed = sorted(set(body) & set(line["fields"]))
        if removed and not self._warned_removed_fields:
            self._warned_removed_fields = True
            self._log.log(self._procs.of(line["proc"]), "WARNING", line["file"], line["text"].format(fields=removed))

    def _chat_prompt(self, body: dict[str, Any]) -> list[str]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("invalid_request", detail="messages: Field required")
        turns = []
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequestError("invalid_request", detail="messages: each message needs a role")
            content = message.get("content") or ""
            if isinstance(content, list):  # content parts: only text is understood
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise BadRequestError("invalid_request", detail="messages: content must be a string or parts")
            turns.append({"role": message["role"], "content": content})
        model = self._facts.scenario.model
        return tokenize(chat_prompt(turns, model.chat_turn, model.chat_generation_prompt))

    async def _stream(
        self, request: web.Request, body: dict[str, Any], generation: Generation, *, chat: bool
    ) -> web.StreamResponse:
        """Server-sent events as vLLM streams them: deltas, a finish chunk, usage on request, [DONE]."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        head = self._head(chat, streaming=True)

        async def send(payload: object) -> None:
            await response.write(f"data: {json.dumps(payload)}\n\n".encode())

        def chunk(piece: str, finish: str | None) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": piece} if piece or finish is None else {}
            else:
                choice["text"] = piece
            if finish is not None:
                choice["stop_reason"] = None
            return {**head, "choices": [choice]}

        if chat:
            first = chunk("", None)
            first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            await send(first)
        sent, tokens = "", []
        try:
            async for token in self._engine.run(generation):
                tokens.append(token)
                text = detokenize(tokens)
                await send(chunk(text[len(sent) :], None))
                sent = text
            await send(chunk("", generation.finish_reason))
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                await send({**head, "choices": [], "usage": _usage(generation)})
        except EngineDeadError:
            _, error = self._catalog.http_body("engine_dead")
            await send(error)
        except FaultResponseError as fault:
            _, error = self._catalog.http_body("fault_response", message=str(fault))
            await send(error)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _completion_prompt(body: dict[str, Any]) -> list[str]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [f"<{t}>" for t in prompt]  # token ids: each one is a token
    raise BadRequestError("invalid_request", detail="prompt must be a string or a list of token ids")


def _usage(generation: Generation) -> dict[str, Any]:
    prompt, completion = len(generation.prompt), len(generation.output)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }
