"""The text server's FastAPI application: models, completions, chat, health, metrics.

Serving a request: readiness (503), model name and parameters (400),
admission (429), then the engine requests start (a prompt that does not fit
is a 400 here) and the response is streamed or collected. A client that
disconnects, streaming or not, cancels its engine requests.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from edge_infer.server import serving_chat, serving_completions
from edge_infer.server.errors import APIError
from edge_infer.server.generation import Generation
from edge_infer.server.http import CLIENT_CLOSED, EventStream, base_app, wait_disconnected
from edge_infer.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    SamplingFields,
)
from edge_infer.server.state import ServerState
from edge_infer.server.streaming import MEDIA_TYPE

log = logging.getLogger(__name__)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "invalid parameters, or a prompt that does not fit max_model_len",
        401: "missing or wrong API key (when the server has one)",
        404: "the model is not served here (model_not_found)",
        413: "the request body is larger than --max-body-bytes",
        429: "admission queue full; see the Retry-After header",
        503: "loading, shutting down, or the engine worker is down",
    }.items()
}
STREAM_RESPONSE = {"content": {MEDIA_TYPE: {"schema": {"type": "string"}}}, "description": "with stream=true: server-sent events"}


def build_app(state: ServerState, loader: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    """The app; ``loader`` loads the engine in the background (default: ``state.load``)."""
    app, auth = base_app("edge-infer", state, loader)
    unknown_fields: set[str] = set()

    def admit_and_start(body: SamplingFields, job: Any) -> tuple[Generation, Any]:
        extra = set(body.model_extra or ()) - unknown_fields
        if extra:
            unknown_fields.update(extra)
            log.warning("ignoring request fields edge-infer does not know: %s", ", ".join(sorted(extra)))
        ticket = state.admit(body.n * len(job.prompts))
        try:
            return Generation(state, job.prompts, job.params, stream=body.stream), ticket
        except BaseException:
            ticket.release()
            raise

    async def respond(request: Request, body: SamplingFields, job: Any, module: Any) -> Response:
        gen, ticket = admit_and_start(body, job)
        if body.stream:

            def close() -> None:
                gen.close()
                ticket.release()

            return EventStream(module.stream(state, job, gen), close)
        work = asyncio.ensure_future(module.complete(state, job, gen))
        watch = asyncio.ensure_future(wait_disconnected(request))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                gen.cancel("the client disconnected")
                work.cancel()
                return Response(status_code=CLIENT_CLOSED)
            return JSONResponse(work.result().model_dump(exclude_none=True))
        finally:
            watch.cancel()
            gen.close()
            ticket.release()

    @app.get("/health", responses={503: {"description": "loading, shutting down, or the engine worker is dead, "
                                                       "unresponsive or restarting (see status and detail)"}})
    async def health() -> JSONResponse:
        if state.phase == "ready" and state.health_status == "ok":
            return JSONResponse({"status": "ok"})
        status = state.phase if state.phase != "ready" else state.health_status
        detail = state.load_error if state.phase != "ready" else state.down_reason()
        return JSONResponse({"status": status, "detail": detail}, status_code=503)

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        stats = await state.engine.refresh_stats() if state.engine.healthy else None
        return Response(state.metrics.render(stats, state.in_flight), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> ModelCard:
        if state.phase == "ready" and (down := state.down_reason()) is not None:
            raise APIError(503, down, code=state.health_status)
        return ModelCard(id=state.settings.served_model_name, created=state.created,
                         max_model_len=state.frontend.max_model_len, runtime=state.frontend.runtime_summary())

    @app.get("/v1/models", dependencies=auth, response_model=ModelList, responses=ERROR_RESPONSES)
    async def models() -> ModelList:
        return ModelList(data=[model_card()])

    @app.get("/v1/models/{model_id:path}", dependencies=auth, response_model=ModelCard, responses=ERROR_RESPONSES)
    async def model(model_id: str) -> ModelCard:
        state.check_model(model_id)
        return model_card()

    @app.post(
        "/v1/chat/completions", dependencies=auth, response_model=ChatCompletionResponse,
        responses={**ERROR_RESPONSES, 200: STREAM_RESPONSE},
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        state.check_ready()
        state.check_model(body.model)
        return await respond(request, body, await state.off_loop(serving_chat.prepare, state, body), serving_chat)

    @app.post(
        "/v1/completions", dependencies=auth, response_model=CompletionResponse,
        responses={**ERROR_RESPONSES, 200: STREAM_RESPONSE},
    )
    async def completions(body: CompletionRequest, request: Request) -> Response:
        state.check_ready()
        state.check_model(body.model)
        return await respond(request, body, await state.off_loop(serving_completions.prepare, state, body),
                             serving_completions)

    return app
