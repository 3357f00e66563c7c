"""The text model's routes: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Serving a request: readiness (503), model name (404) and parameters (400),
admission (429), then the prompt is rendered and tokenized off the event
loop, the engine requests start (a prompt that does not fit is a 400 here)
and the response is streamed or collected. A client that disconnects,
streaming or not, cancels its engine requests.
"""
from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge_infer.server import serving_chat, serving_completions
from edge_infer.server.generation import Generation
from edge_infer.server.http import CLIENT_CLOSED, ClientGone, EventStream, unless_disconnected
from edge_infer.server.protocol import (
    ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse, SamplingFields,
)
from edge_infer.server.responses import ERROR_RESPONSES, STREAM_RESPONSE
from edge_infer.server.text_service import TextService

log = logging.getLogger(__name__)


def text_router(service: TextService, auth: list[Any]) -> APIRouter:
    router = APIRouter()
    unknown_fields: set[str] = set()

    def admit_and_start(body: SamplingFields, job: Any) -> tuple[Generation, Any]:
        extra = set(body.model_extra or ()) - unknown_fields
        if extra:
            unknown_fields.update(extra)
            log.warning("ignoring request fields edge-infer does not know: %s", ", ".join(sorted(extra)))
        ticket = service.admit(body.n * len(job.prompts))
        try:
            return Generation(service, job.prompts, job.params, stream=body.stream), ticket
        except BaseException:
            ticket.release()
            raise

    async def respond(request: Request, body: SamplingFields, prepare: Any, module: Any) -> Response:
        service.check_ready()
        service.check_model(body.model)
        job = await service.off_loop(prepare, service, body)
        gen, ticket = admit_and_start(body, job)
        if body.stream:

            def close() -> None:
                gen.close()
                ticket.release()

            return EventStream(module.stream(service, job, gen), close)
        try:
            result = await unless_disconnected(request, module.complete(service, job, gen))
            return JSONResponse(result.model_dump(exclude_none=True))
        except ClientGone:
            gen.cancel("the client disconnected")
            return Response(status_code=CLIENT_CLOSED)
        finally:
            gen.close()
            ticket.release()

    @router.post("/v1/chat/completions", dependencies=auth, response_model=ChatCompletionResponse,
                 responses={**ERROR_RESPONSES, 200: STREAM_RESPONSE})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await respond(request, body, serving_chat.prepare, serving_chat)

    @router.post("/v1/completions", dependencies=auth, response_model=CompletionResponse,
                 responses={**ERROR_RESPONSES, 200: STREAM_RESPONSE})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await respond(request, body, serving_completions.prepare, serving_completions)

    return router
