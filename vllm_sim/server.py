"""vLLM's OpenAI-compatible HTTP API, served (vllm_sim/http.py) on the socket bound during start-up.

Bodies, status codes, error texts and headers follow vLLM 0.32 (FastAPI on uvicorn) as its CPU build answers
the same requests (tests/test_sim_follows_real.py compares them), including the uvicorn access log line, so a
client or a prober cannot tell it from the real server. What a request must pass is vllm_sim/admission.py;
the bodies of a completion are vllm_sim/replies.py.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus

from vllm_sim.admission import Admission, BadRequestError, completion_prompt, json_body, validation
from vllm_sim.catalog import Catalog
from vllm_sim.datafiles import load
from vllm_sim.engine import Engine, EngineDeadError, FaultResponseError
from vllm_sim.http import HttpServer, Request, Response, json_response
from vllm_sim.logwriter import LogWriter, Procs
from vllm_sim.metrics import CONTENT_TYPE, Metrics
from vllm_sim.replies import Replies
from vllm_sim.sizing import Facts
from vllm_sim.tokenizer import detokenize, token_id, token_of


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
    """vLLM's routes: each answers as vLLM does, a refusal with vLLM's error body and log line."""

    def __init__(self, engine: Engine, facts: Facts, catalog: Catalog, log: LogWriter, procs: Procs) -> None:
        self._engine = engine
        self._facts = facts
        self._catalog = catalog
        self._log = log
        self._procs = procs
        self._admission = Admission(engine, facts, log, procs)
        self._replies = Replies(engine, facts, catalog)
        self._metrics = Metrics(engine, facts.settings.served_model_name, facts.values())
        self._created = int(time.time())
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
            body = await json_body(request)
            self._admission.check_model(body)
            if "messages" in body:
                prompt = self._admission.chat_prompt(
                    body, generation_prompt=body.get("add_generation_prompt", True) is True
                )
            elif "prompt" in body:
                prompt = completion_prompt(body)
            else:
                raise validation(body, [("missing", "body.prompt"), ("missing", "body.messages")])
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
            body = await json_body(request)
            self._admission.check_model(body)
        except BadRequestError as refused:
            return self._error(refused, "tokenize")
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            return self._error(validation(body, [("missing", "body.tokens")]), "tokenize")
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
            body, generation = await self._admission.accept(request, chat=chat)
        except BadRequestError as refused:
            return self._error(refused, route)
        if self._engine.dead.is_set():
            return self._error(BadRequestError("engine_dead"), route)
        if body.get("stream") is True:
            events = self._replies.events(body, generation, chat=chat)
            return Response(200, content_type="text/event-stream; charset=utf-8", stream=events)
        try:
            tokens = [token async for token in self._engine.run(generation)]
        except EngineDeadError:
            return self._error(BadRequestError("engine_dead"), route)
        except FaultResponseError as fault:
            return self._error(BadRequestError("fault_response", message=str(fault)), route)
        return json_response(self._replies.whole(generation, tokens, chat=chat))
