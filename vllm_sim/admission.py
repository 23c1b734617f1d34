"""Request admission for the OpenAI-compatible API: what vLLM 0.32 checks before it generates, in its order.

A refused request raises BadRequestError; vllm_sim/server.py turns it into vLLM's error body and log line.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_sim.datafiles import load
from vllm_sim.engine import Engine, Generation
from vllm_sim.http import Request
from vllm_sim.logwriter import LogWriter, Procs
from vllm_sim.sizing import Facts
from vllm_sim.tokenizer import chat_prompt, tokenize


class BadRequestError(Exception):
    """A request vLLM refuses: an http error key of errors.toml and the names its texts use."""

    def __init__(self, key: str, **names: object) -> None:
        super().__init__(key)
        self.key = key
        self.names = names


class Admission:
    """Validates requests against the served model and its settings (one per server: warnings are logged once)."""

    def __init__(self, engine: Engine, facts: Facts, log: LogWriter, procs: Procs) -> None:
        self._engine = engine
        self._facts = facts
        self._log = log
        self._procs = procs
        self._warned_removed_fields = False

    async def accept(self, request: Request, *, chat: bool) -> tuple[dict[str, Any], Generation]:
        """The validated request, checked in vLLM's order: its body and what the engine is to generate for it."""
        body = await json_body(request)
        if chat and "messages" not in body:
            raise validation(body, [("missing", "body.messages")])
        self._warn_removed_fields(body)
        self.check_model(body)
        if chat:
            self._check_tools(body)
            prompt = self.chat_prompt(body, generation_prompt=True)
        else:
            prompt = completion_prompt(body)
        limit = self._facts.max_model_len
        if len(prompt) > limit:
            by_ids = not chat and isinstance(body.get("prompt"), list) and not isinstance(body["prompt"][0], str)
            # a text prompt is tokenized only up to one token past the limit
            key, counted = ("prompt_ids_too_long", len(prompt)) if by_ids else ("prompt_too_long", limit + 1)
            raise BadRequestError(key, max_model_len=limit, prompt_tokens=counted)
        asked = self._asked_tokens(body, chat=chat)
        room = limit - len(prompt)
        max_tokens = room if asked is None and chat else min(16 if asked is None else asked, room)  # vLLM cuts
        if max_tokens < 1:
            raise BadRequestError("max_tokens_too_small", max_tokens=max_tokens)
        return body, self._engine.plan(prompt, max_tokens, tools=bool(body.get("tools")))

    def _asked_tokens(self, body: dict[str, Any], *, chat: bool) -> int | None:
        """The request's max_tokens (max_completion_tokens for a chat that gives it), None if it gives none."""
        limit = self._facts.max_model_len
        name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        asked = body.get(name)
        if asked is None:
            return None
        if isinstance(asked, str) and not asked.strip().lstrip("-").isdigit():
            raise validation(body, [("int_parsing", f"body.{name}")], given=asked)
        if isinstance(asked, str):
            asked = int(asked)
        if not isinstance(asked, int) or isinstance(asked, bool):
            raise BadRequestError("invalid_request", detail=f"{name} must be an integer, got {asked!r}")
        if asked > limit:
            raise BadRequestError("max_tokens_too_large", name=name, max_tokens=asked, max_model_len=limit)
        if asked < 1:
            raise BadRequestError("max_tokens_too_small", max_tokens=asked)
        return asked

    def check_model(self, body: dict[str, Any]) -> None:
        served = self._facts.settings.served_model_name
        if body.get("model") not in (None, served):
            raise BadRequestError("model_not_found", model=body["model"], aliases=served)

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

    def chat_prompt(self, body: dict[str, Any], *, generation_prompt: bool) -> list[str]:
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


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, or FastAPI's validation error for what it got instead."""
    text = request.text()
    if not text.strip():
        raise validation(None, [("missing", "body")])
    try:
        body = json.loads(text)
    except json.JSONDecodeError as bad:
        raise validation({}, [("json_invalid", f"body.{bad.pos}")], error=bad.msg) from None
    if not isinstance(body, dict):
        raise validation(body, [("model_attributes_type", "body")])
    return body


_VALIDATION_MSG = {
    "missing": "Field required",
    "json_invalid": "JSON decode error",
    "model_attributes_type": "Input should be a valid dictionary or object to extract fields from",
    "int_parsing": "Input should be a valid integer, unable to parse string as an integer",
}


def validation(
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


def completion_prompt(body: dict[str, Any]) -> list[str]:
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
