"""The HTTP side of ``cdlm-serve``: LitServe's ``OpenAISpec`` with what cdlm adds to it.

- ``POST /v1/chat/completions`` and ``POST /v1/completions`` (LitServe 0.2.19 has no spec for
  the second: it is one more endpoint, ``LitSpec.add_endpoint``, on the same request queue);
  both answer in OpenAI's format, streamed as server-sent events with ``stream: true``, each
  event with ``canvas`` beside the choices where the request asked for ``stream_canvas``.
- ``GET /v1/models``: the one model served.

Request models take extra fields (the cdlm options travel there). Every request waits for its
first chunk (``cdlm.serve.api``) before it answers, so a refused request gets HTTP 400 with its
one-line message, not a 200 stream that fails later. A stream whose client disconnects puts its
id in ``gone``, which the worker reads at every sampler step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from fastapi import HTTPException
from fastapi.responses import StreamingResponse
from litserve.specs.openai import ChatCompletionRequest, OpenAISpec
from litserve.utils import LitAPIStatus, ResponseBufferItem
from pydantic import BaseModel, ConfigDict

from cdlm.serve.requests import ID

USAGE = ("prompt_tokens", "completion_tokens", "total_tokens")


class ChatRequest(ChatCompletionRequest):
    model_config = ConfigDict(extra="allow")


class CompletionRequest(BaseModel):
    """OpenAI's completions request: a ``prompt`` (or cdlm's ``infill``) and any fields beside
    it, read by ``cdlm.serve.requests``."""

    model_config = ConfigDict(extra="allow")
    model: str | None = ""
    prompt: str | None = None
    stream: Any = False


class CdlmSpec(OpenAISpec):
    """``OpenAISpec`` serving ``model_name`` on chat and completions (see the module)."""

    def __init__(self, model_name: str, gone: Any) -> None:
        super().__init__()
        self.model_name, self.gone = model_name, gone

    def pre_setup(self, lit_api) -> None:
        super().pre_setup(lit_api)
        self.add_endpoint("/v1/completions", self.completion, ["POST"])
        self.add_endpoint("/v1/models", self.models, ["GET"])

    def populate_context(self, context: dict, request: BaseModel) -> None:
        """Nothing: the spec's own reads ``messages``, which a completion request lacks."""

    async def models(self) -> dict[str, Any]:
        entry = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "cdlm"}
        return {"object": "list", "data": [entry]}

    async def chat_completion(self, request: ChatRequest, background_tasks=None):
        return await self._answer(request, "chat.completion")

    async def completion(self, request: CompletionRequest):
        return await self._answer(request, "text_completion")

    async def _answer(self, request: BaseModel, what: str):
        uid = uuid.uuid4()
        setattr(request, ID, str(uid))
        chunks = await self._submit(uid, request)
        head = {"id": f"cmpl-{uid.hex[:12]}", "object": what, "created": int(time.time())}
        head["model"] = getattr(request, "model", None) or self.model_name
        if request.stream is True:
            events = self._events(uid, head, chunks, what)
            return StreamingResponse(events, media_type="text/event-stream")
        text, usage = "", {}
        async for chunk in chunks:
            text += chunk.get("content", "")
            usage = {k: chunk[k] for k in USAGE if k in chunk} or usage
        return head | {"choices": [_choice(what, text, "stop", whole=True)], "usage": usage}

    async def _submit(self, uid: uuid.UUID, request: BaseModel) -> AsyncIterator[dict]:
        """Queues ``request`` and returns its chunks up to its ``done`` one; raises
        HTTPException(400) if the worker refused it (its first chunk's ``error``)."""
        q, event = deque(), asyncio.Event()
        self.response_buffer[uid] = ResponseBufferItem(response_queue=q, event=event)
        self.request_queue.put((self.response_queue_id, uid, time.monotonic(), request))
        pipe = self.data_streamer(q, event, send_status=True)
        first = await self._next(pipe, uid)
        if first is None or first.get("error"):
            self.response_buffer.pop(uid, None)  # what the batch still sends it is dropped
            raise HTTPException(400, first["error"] if first else "the request was not drawn")

        async def rest() -> AsyncIterator[dict]:
            try:
                while (chunk := await self._next(pipe, uid)) is not None:
                    if chunk:
                        yield chunk
                    if chunk.get("done"):
                        return
            finally:
                self.response_buffer.pop(uid, None)

        return rest()

    async def _next(self, pipe, uid: uuid.UUID) -> dict | None:
        try:
            data, status = await pipe.__anext__()
        except StopAsyncIteration:
            return None
        if status == LitAPIStatus.ERROR:
            self.response_buffer.pop(uid, None)
            raise data if isinstance(data, HTTPException) else HTTPException(500, str(data))
        return json.loads(data)

    async def _events(self, uid: uuid.UUID, head: dict, chunks, what: str) -> AsyncIterator[str]:
        """The chunks as server-sent events; a client that leaves early is named in ``gone``."""
        head = head | {"object": f"{what}.chunk" if what == "chat.completion" else what}
        finished = False
        try:
            async for chunk in chunks:
                event = head | {"choices": [_choice(what, chunk.get("content", ""), None)]}
                if "canvas" in chunk:
                    event["canvas"] = chunk["canvas"]
                if chunk.get("done"):
                    event["usage"] = {k: chunk[k] for k in USAGE}
                    event["choices"][0]["finish_reason"] = "stop"
                yield f"data: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                self.gone[str(uid)] = True


def _choice(what: str, text: str, finish: str | None, whole: bool = False) -> dict:
    """One choice of a ``what`` answer: a chat message (``whole``) or delta, or a text."""
    if what == "text_completion":
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    part = {"role": "assistant", "content": text}
    return {"index": 0, "message" if whole else "delta": part, "finish_reason": finish}
