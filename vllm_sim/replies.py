"""The bodies vLLM 0.32 answers a completion with: the whole JSON object, or the server-sent events of a stream.

Field names, their order and their nulls follow vLLM's pydantic models (tests/test_sim_follows_real.py compares).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from vllm_sim.catalog import Catalog
from vllm_sim.engine import Engine, EngineDeadError, FaultResponseError, Generation
from vllm_sim.sizing import Facts
from vllm_sim.tokenizer import detokenize


class Replies:
    """Shapes a generation into vLLM's answer for /v1/chat/completions (chat) or /v1/completions."""

    def __init__(self, engine: Engine, facts: Facts, catalog: Catalog) -> None:
        self._engine = engine
        self._facts = facts
        self._catalog = catalog
        seed = f"{facts.settings.model}|{facts.settings.served_model_name}".encode()
        self._fingerprint = f"vllm-{facts.scenario.image.vllm}-{hashlib.sha256(seed).hexdigest()[:8]}"

    def whole(self, generation: Generation, tokens: list[str], *, chat: bool) -> dict[str, Any]:
        """The answer to a request that did not ask to stream, once the engine generated its tokens."""
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
        return payload

    def _head(self, chat: bool, *, streaming: bool) -> dict[str, Any]:
        kind = ("chat.completion" if chat else "text_completion") + (".chunk" if streaming and chat else "")
        prefix = "chatcmpl" if chat else "cmpl"
        return {
            "id": f"{prefix}-{uuid.uuid4().hex[:16]}",
            "object": kind,
            "created": int(time.time()),
            "model": self._facts.settings.served_model_name,
        }

    async def events(self, body: dict[str, Any], generation: Generation, *, chat: bool) -> AsyncIterator[bytes]:
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


def _usage(generation: Generation) -> dict[str, Any]:
    prompt, completion = len(generation.prompt), len(generation.output)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
