"""The text model's routes: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Serving a request: readiness (503), model name (404) and parameters (400),
admission (429), then the prompt is rendered and tokenized off the event
loop (with its media read and decoded, on the media threads), the engine
requests start (a prompt that does not fit is a 400 here) and the response
is streamed or collected. A client that disconnects, streaming or not,
cancels its engine requests; one that leaves while its prompt is prepared
is not served.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge_infer.server import serving_chat, serving_completions
from edge_infer.server.generation import Generation
from edge_infer.server.http import CLIENT_CLOSED, ClientGone, EventStream, unless_disconnected
from edge_infer.server.protocol import (
    ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse, SamplingFields, UnknownFields,
)
from edge_infer.server.responses import ERROR_RESPONSES, STREAM_RESPONSE
from edge_infer.server.text_service import TextService


def text_router(service: TextService, auth: list[Any]) -> APIRouter:
    router = APIRouter()
    unknown_fields = UnknownFields()

    async def prepare_and_start(request: Request, body: SamplingFields, prepare: Any) -> tuple[Any, Generation, Any]:
        """The prepared job, its started generation and its admission ticket. Admitted first, so that a full
        server refuses (429) before it spends seconds decoding a request's media; ClientGone when the client
        leaves during the preparation (its result is dropped). A request with media then waits for room in the
        worker before its media are decoded."""
        ticket = service.admit(body.n * body.prompt_count)
        try:
            media = isinstance(body, ChatCompletionRequest) and body.has_media
            if media and service.frontend.media_limits is not None:  # queued requests hold no decoded media
                ticket.media = await unless_disconnected(request, service.engine.media_gate.acquire(ticket.n))
            job = await unless_disconnected(request, service.off_loop(prepare, service, body, media=media))
            return job, Generation(service, job.prompts, job.params, stream=body.stream, media=ticket.media), ticket
        except BaseException:
            ticket.release()
            raise

    async def respond(request: Request, body: SamplingFields, prepare: Any, module: Any) -> Response:
        service.check_ready()
        service.check_model(body.model)
        unknown_fields.note(body)
        try:
            job, gen, ticket = await prepare_and_start(request, body, prepare)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
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
