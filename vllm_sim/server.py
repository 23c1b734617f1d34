"""vLLM's OpenAI-compatible HTTP API, served (vllm_sim/http.py) on the socket bound during start-up.

Bodies, status codes, error texts and headers follow vLLM 0.32 (FastAPI on uvicorn) as its CPU build answers
the same requests (tests/test_sim_follows_real.py compares them), including the uvicorn access log line, so a
client or a prober cannot tell it from the real server.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

from vllm_sim.catalog import Catalog
from vllm_sim.datafiles import load
from vllm_sim.engine import Engine, EngineDeadError, FaultResponseError, Generation
from vllm_sim.http import HttpServer, Request, Response, json_response
from vllm_sim.logwriter import LogWriter, Procs
from vllm_sim.metrics import CONTENT_TYPE, Metrics
from vllm_sim.sizing import Facts
from vllm_sim.tokenizer import chat_prompt, detokenize, token_id, token_of, tokenize


class BadRequestError(Exception):
    """A request vLLM refuses: an http error key of errors.toml and the names its texts use."""

    def __init__(self, key: str, **names: object) -> None:
        super().__init__(key)
        self.key = key
        self.names = names


def _access_line(log: LogWriter) -> Callable[[Request, int], None]:
    template = load("log.toml")["access"]["text"]

    def access(request: Request, status: int) -> None:
        """uvicorn's access line: client address, request line, status and reason phrase."""
        line = f"{request.method} {request.target} HTTP/{request.version}"
        reason = HTTPStatus(status).phrase
        text = template.format(client=request.peer, request_line=line, status=status, reason=reason)
        log.write("stdout", text + "\n")  # uvicorn's access logger: no process prefix

    return access


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
        seed = f"{facts.settings.model}|{facts.settings.served_model_name}".encode()
        self._fingerprint = f"vllm-{facts.scenario.image.vllm}-{hashlib.sha256(seed).hexdigest()[:8]}"
        self._http = HttpServer(
            {
                "/health": {"GET": self._health},
                "/ping": {"*": self._health},
                "/version": {"GET": self._version},
                "/v1/models": {"GET": self._models},
                "/metrics": {"GET": self._render_metrics},
                "/tokenize": {"POST": self._tokenize},
                "/detokenize": {"POST": self._detokenize},
                "/v1/chat/completions": {"POST": self._chat},
                "/v1/completions": {"POST": self._completions},
            },
            None if facts.settings.disable_access_log else _access_line(log),
        )

    async def start(self, sock: socket.socket) -> None:
        """Starts accepting on the socket bound at start-up (this is when connects stop being refused)."""
        await self._http.start(sock)

    async def stop(self) -> None:
        await self._http.stop()

    async def _health(self, request: Request) -> Response:
        return Response(503 if self._engine.dead.is_set() else 200)

    async def _version(self, request: Request) -> Response:
        return json_response({"version": self._facts.scenario.image.vllm})

    async def _models(self, request: Request) -> Response:
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
                    "id": f"modelperm-{uuid.uuid4().hex[:16]}",
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
        return json_response({"object": "list", "data": [card]})

    async def _render_metrics(self, request: Request) -> Response:
        return Response(200, self._metrics.render().encode(), CONTENT_TYPE)

    async def _tokenize(self, request: Request) -> Response:
        """vLLM's /tokenize: the exact count of a prompt or a chat (with its template), never refused for length."""
        try:
            body = await _json_body(request)
            self._check_model(body)
            if "messages" in body:
                prompt = self._chat_prompt(body, generation_prompt=body.get("add_generation_prompt", True) is True)
            elif "prompt" in body:
                prompt = _completion_prompt(body)
            else:
                raise _validation(body, [("missing", "body.prompt"), ("missing", "body.messages")])
        except BadRequestError as refused:
            return self._error(refused, "tokenize")
        strs = prompt if body.get("return_token_strs") is True else None
        answer = {
            "count": len(prompt),
            "max_model_len": self._facts.max_model_len,
            "tokens": [token_id(token) for token in prompt],
            "token_strs": strs,
        }
        return json_response(answer)

    async def _detokenize(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            self._check_model(body)
        except BadRequestError as refused:
            return self._error(refused, "tokenize")
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            return self._error(_validation(body, [("missing", "body.tokens")]), "tokenize")
        return json_response({"prompt": detokenize([token_of(i) for i in ids])})

    async def _chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    def _error(self, refused: BadRequestError, route: str) -> Response:
        """The error's body, and the line vLLM logs for it on this route."""
        status, body = self._catalog.http_body(refused.key, **refused.names)
        line = self._catalog.http_log(refused.key, route, str(body["error"]["message"]))  # type: ignore[index]
        if line is not None:
            level, file, text = line
            self._log.log(self._procs.api, level, file, text)
        return json_response(body, status=status)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        route = "chat" if chat else "completion"
        try:
            body, generation = await self._accept(request, chat=chat)
        except BadRequestError as refused:
            return self._error(refused, route)
        if self._engine.dead.is_set():
            return self._error(BadRequestError("engine_dead"), route)
        if body.get("stream") is True:
            return self._stream(body, generation, chat=chat)
        try:
            tokens = [token async for token in self._engine.run(generation)]
        except EngineDeadError:
            return self._error(BadRequestError("engine_dead"), route)
        except FaultResponseError as fault:
            return self._error(BadRequestError("fault_response", message=str(fault)), route)
        text = detokenize(tokens)
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=generation.finish_reason, stop_reason=None, token_ids=None)
        if not chat:
            choice.update(prompt_logprobs=None, prompt_token_ids=None)
        choice["routed_experts"] = None
        payload = {
            **self._head(chat, streaming=False),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self._fingerprint,
            "usage": {**_usage(generation), "prompt_tokens_details": None, "completion_tokens_details": None},
        }
        if chat:
            payload.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        payload.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return json_response(payload)

    def _head(self, chat: bool, *, streaming: bool) -> dict[str, Any]:
        kind = ("chat.completion" if chat else "text_completion") + (".chunk" if streaming and chat else "")
        prefix = "chatcmpl" if chat else "cmpl"
        return {
            "id": f"{prefix}-{uuid.uuid4().hex[:16]}",
            "object": kind,
            "created": int(time.time()),
            "model": self._facts.settings.served_model_name,
        }

    def _check_model(self, body: dict[str, Any]) -> None:
        served = self._facts.settings.served_model_name
        if body.get("model") not in (None, served):
            raise BadRequestError("model_not_found", model=body["model"], aliases=served)

    async def _accept(self, request: Request, *, chat: bool) -> tuple[dict[str, Any], Generation]:
        """The validated request, checked in vLLM's order: its body and what the engine is to generate for it."""
        body = await _json_body(request)
        if chat and "messages" not in body:
            raise _validation(body, [("missing", "body.messages")])
        self._warn_removed_fields(body)
        self._check_model(body)
        if chat:
            self._check_tools(body)
            prompt = self._chat_prompt(body, generation_prompt=True)
        else:
            prompt = _completion_prompt(body)
        limit = self._facts.max_model_len
        if len(prompt) > limit:
            by_ids = not chat and isinstance(body.get("prompt"), list) and not isinstance(body["prompt"][0], str)
            # a text prompt is tokenized only up to one token past the limit
            key, counted = ("prompt_ids_too_long", len(prompt)) if by_ids else ("prompt_too_long", limit + 1)
            raise BadRequestError(key, max_model_len=limit, prompt_tokens=counted)
        name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        asked = body.get(name)
        if asked is not None:
            if isinstance(asked, str) and not asked.strip().lstrip("-").isdigit():
                raise _validation(body, [("int_parsing", f"body.{name}")], given=asked)
            if isinstance(asked, str):
                asked = int(asked)
            if not isinstance(asked, int) or isinstance(asked, bool):
                raise BadRequestError("invalid_request", detail=f"{name} must be an integer, got {asked!r}")
            if asked > limit:
                raise BadRequestError("max_tokens_too_large", name=name, max_tokens=asked, max_model_len=limit)
            if asked < 1:
                raise BadRequestError("max_tokens_too_small", max_tokens=asked)
        room = limit - len(prompt)
        max_tokens = room if asked is None and chat else min(16 if asked is None else asked, room)  # vLLM cuts
        if max_tokens < 1:
            raise BadRequestError("max_tokens_too_small", max_tokens=max_tokens)
        return body, self._engine.plan(prompt, max_tokens, tools=bool(body.get("tools")))

    def _check_tools(self, body: dict[str, Any]) -> None:
        """Tools need the flags that let vLLM parse tool calls: without them it refuses the request."""
        if not body.get("tools"):
            return
        command = self._facts.settings.command
        choice = body.get("tool_choice", "auto")
        parser = command.has("--tool-call-parser")
        if choice == "auto" and not (command.has("--enable-auto-tool-choice") and parser):
            raise BadRequestError("auto_tool_choice")
        if choice == "required" and not parser:
            raise BadRequestError("tool_choice_needs_parser", choice='"required"')
        if isinstance(choice, dict) and not parser:
            function = choice.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            raise BadRequestError("tool_choice_needs_parser", choice=f'function "{name}"')

    def _warn_removed_fields(self, body: dict[str, Any]) -> None:
        """vLLM's warning_once for removed guided-decoding fields (ignored: the output is unconstrained)."""
        line = load("log.toml")["removed_request_fields"]
        removed = sorted(set(body) & set(line["fields"]))
        if removed and not self._warned_removed_fields:
            self._warned_removed_fields = True
            self._log.log(self._procs.of(line["proc"]), "WARNING", line["file"], line["text"].format(fields=removed))

    def _chat_prompt(self, body: dict[str, Any], *, generation_prompt: bool) -> list[str]:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequestError("invalid_request", detail="messages: Input should be a valid list")
        if not messages:
            raise BadRequestError("empty_conversation")
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
        return tokenize(chat_prompt(turns, model.chat_turn, model.chat_generation_prompt if generation_prompt else ""))

    def _stream(self, body: dict[str, Any], generation: Generation, *, chat: bool) -> Response:
        return Response(
            200, content_type="text/event-stream; charset=utf-8", stream=self._events(body, generation, chat=chat)
        )

    async def _events(self, body: dict[str, Any], generation: Generation, *, chat: bool) -> AsyncIterator[bytes]:
        """Server-sent events as vLLM streams them: deltas (the last one carries finish_reason), usage on
        request, [DONE]."""
        head = self._head(chat, streaming=True)

        def send(payload: object) -> bytes:
            return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

        def chunk(piece: str, finish: str | None) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0}
            if chat:
                choice["delta"] = {"content": piece}
            else:
                choice["text"] = piece
            choice.update(logprobs=None, finish_reason=finish)
            if finish is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = None
            return {**head, "choices": [choice]}

        if chat:
            first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            first["choices"][0].update(logprobs=None, finish_reason=None)
            yield send({**first, "prompt_token_ids": None, "prompt_text": None})
        sent, tokens, held = "", [], None
        try:
            async for token in self._engine.run(generation):
                tokens.append(token)
                text = detokenize(tokens)
                if held is not None:
                    yield send(chunk(held, None))
                held, sent = text[len(sent) :], text
            yield send(chunk(held or "", generation.finish_reason))
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                usage = {**head, "choices": [], "usage": _usage(generation), "system_fingerprint": self._fingerprint}
                yield send(usage)
        except EngineDeadError:
            _, error = self._catalog.http_body("engine_dead")
            yield send(error)
        except FaultResponseError as fault:
            _, error = self._catalog.http_body("fault_response", message=str(fault))
            yield send(error)
        yield b"data: [DONE]\n\n"


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, or FastAPI's validation error for what it got instead."""
    text = request.text()
    if not text.strip():
        raise _validation(None, [("missing", "body")])
    try:
        body = json.loads(text)
    except json.JSONDecodeError as bad:
        raise _validation({}, [("json_invalid", f"body.{bad.pos}")], error=bad.msg) from None
    if not isinstance(body, dict):
        raise _validation(body, [("model_attributes_type", "body")])
    return body


_VALIDATION_MSG = {
    "missing": "Field required",
    "json_invalid": "JSON decode error",
    "model_attributes_type": "Input should be a valid dictionary or object to extract fields from",
    "int_parsing": "Input should be a valid integer, unable to parse string as an integer",
}


def _validation(
    body: object, errors: list[tuple[str, str]], *, given: object = None, error: str = ""
) -> BadRequestError:
    """pydantic's errors as vLLM 0.32 words them: one `{...}` line per error; param is the first one's loc."""
    if isinstance(body, dict | list):
        shown: object = f"<{type(body).__name__} of {len(body)} items>"
    else:
        shown = "None" if body is None else body
    lines = []
    for kind, loc in errors:
        entry: dict[str, object] = {"type": kind, "loc": loc, "msg": _VALIDATION_MSG[kind]}
        entry["input"] = given if kind == "int_parsing" else shown
        if kind == "json_invalid":
            entry["ctx"] = {"error": error}
        lines.append(f"  {entry}")
    return BadRequestError(
        "validation",
        count=len(errors),
        plural="" if len(errors) == 1 else "s",
        errors="\n".join(lines),
        loc=errors[0][1],
    )


def _completion_prompt(body: dict[str, Any]) -> list[str]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return tokenize(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [f"<{t}>" for t in prompt]  # token ids: each one is a token
    if prompt is None or prompt in ("", []):
        raise BadRequestError("no_prompt")
    raise BadRequestError("invalid_request", detail="prompt must be a string or a list of token ids")


def _usage(generation: Generation) -> dict[str, Any]:
    prompt, completion = len(generation.prompt), len(generation.output)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
