"""The FastAPI application of a speech server: ``/v1/audio/speech``, ``/v1/audio/voices``, models, health, metrics.

It shares the text server's pieces (OpenAI error objects, API-key check,
request counting, the stream that cleans up however it ends) and serves a
``SpeechServerState`` instead of a text engine.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from edge_infer.server.errors import APIError
from edge_infer.server.http import CLIENT_CLOSED, EventStream, base_app, wait_disconnected
from edge_infer.server.protocol import ErrorResponse, ModelCard, ModelList
from edge_infer.server.serving_speech import SpeechRun, audio_body, sse_body, whole_audio
from edge_infer.server.speech_protocol import SpeechRequest, VoiceList
from edge_infer.server.speech_state import SpeechServerState
from edge_infer.server.streaming import MEDIA_TYPE
from edge_infer.tts.audio import MEDIA_TYPES, STREAMABLE

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "invalid input, voice, format or parameters (speed other than 1.0 included)",
        401: "missing or wrong API key (when the server has one)",
        429: "admission queue full; see the Retry-After header",
        500: "the pipeline failed the request before any audio",
        503: "loading, shutting down, or a pipeline stage is down",
    }.items()
}
AUDIO_RESPONSE = {"content": {t: {} for t in (*MEDIA_TYPES.values(), MEDIA_TYPE)}, "description": "the audio, streamed as it is produced"}


class _ClientGone(Exception):
    pass


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            raise _ClientGone
        return task.result()
    finally:
        watch.cancel()


def build_speech_app(state: SpeechServerState, loader: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    """The app; ``loader`` starts the pipeline in the background (default: ``state.load``)."""
    app, auth = base_app("edge-infer (speech)", state, loader)

    @app.get("/health", responses={503: {"description": "loading, shutting down, or a pipeline stage is down"}})
    async def health() -> JSONResponse:
        if state.phase == "ready" and state.healthy():
            return JSONResponse({"status": "ok", "stages": [st.to_dict() for st in state.omni.health().stages]})
        if state.phase in ("loading", "failed"):
            return JSONResponse({"status": state.phase, "detail": state.load_error}, status_code=503)
        down = [f"{s.label} is {s.state} ({s.detail})" for s in state.omni.health().stages if s.state != "running"]
        status = state.phase if state.phase != "ready" else "engine_dead"
        return JSONResponse({"status": status, "detail": "; ".join(down) or None}, status_code=503)

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        health = state.omni.health() if state.phase not in ("loading", "failed") else None
        return Response(state.metrics.render(health, state.in_flight), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=auth, response_model=ModelList, responses=ERROR_RESPONSES)
    async def models() -> ModelList:
        card = ModelCard(id=state.settings.served_model_name, created=state.created, max_model_len=state.max_model_len)
        return ModelList(data=[card])

    @app.get("/v1/audio/voices", dependencies=auth, response_model=VoiceList, responses=ERROR_RESPONSES)
    async def voices() -> VoiceList:
        return state.voice_list()

    @app.post("/v1/audio/speech", dependencies=auth, responses={**ERROR_RESPONSES, 200: AUDIO_RESPONSE})
    async def speech(body: SpeechRequest, request: Request) -> Response:
        state.check_ready()
        state.check_model(body.model)
        job = state.prepare(body)
        ticket = state.admit()
        run = SpeechRun(state, job)

        def close() -> None:
            run.close()
            ticket.release()

        try:
            first = await _unless_disconnected(request, run.next_audio())
            if job.stream_format == "sse":
                return EventStream(sse_body(run, first), close)
            if first is not None and job.response_format in STREAMABLE:
                return EventStream(audio_body(run, first), close, media_type=MEDIA_TYPES[job.response_format])
            audio = await _unless_disconnected(request, whole_audio(run, first))
        except _ClientGone:
            close()
            return Response(status_code=CLIENT_CLOSED)
        except BaseException:
            close()
            raise
        close()
        return Response(audio, media_type=MEDIA_TYPES[job.response_format])

    @app.api_route("/v1/chat/completions", methods=["POST"], include_in_schema=False)
    @app.api_route("/v1/completions", methods=["POST"], include_in_schema=False)
    async def text_routes() -> None:
        raise APIError(404, f"{state.settings.served_model_name!r} is a speech model: this server serves POST /v1/audio/speech",
                       code="not_a_text_model")

    return app
