"""The speech model's routes: ``POST /v1/audio/speech`` and ``GET /v1/audio/voices``."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from edge_infer.server.http import CLIENT_CLOSED, ClientGone, EventStream, unless_disconnected
from edge_infer.server.protocol import UnknownFields
from edge_infer.server.responses import ERROR_RESPONSES
from edge_infer.server.serving_speech import SpeechRun, audio_body, sse_body, whole_audio
from edge_infer.server.speech_protocol import SpeechRequest, VoiceList
from edge_infer.server.speech_service import SpeechService
from edge_infer.server.streaming import MEDIA_TYPE
from edge_infer.tts.audio import MEDIA_TYPES, STREAMABLE

AUDIO_RESPONSE = {"content": {t: {} for t in (*MEDIA_TYPES.values(), MEDIA_TYPE)}, "description": "the audio, streamed as it is produced"}


def speech_router(service: SpeechService, auth: list[Any]) -> APIRouter:
    router = APIRouter()
    unknown_fields = UnknownFields()

    @router.get("/v1/audio/voices", dependencies=auth, response_model=VoiceList, responses=ERROR_RESPONSES)
    async def voices() -> VoiceList:
        return service.voice_list()

    @router.post("/v1/audio/speech", dependencies=auth, responses={**ERROR_RESPONSES, 200: AUDIO_RESPONSE})
    async def speech(body: SpeechRequest, request: Request) -> Response:
        service.check_ready()
        service.check_model(body.model)
        unknown_fields.note(body)
        job = service.prepare(body)
        ticket = service.admit()
        run = SpeechRun(service, job)

        def close() -> None:
            run.close()
            ticket.release()

        try:
            first = await unless_disconnected(request, run.next_audio())
            if job.stream_format == "sse":
                return EventStream(sse_body(run, first), close)
            if first is not None and job.response_format in STREAMABLE:
                return EventStream(audio_body(run, first), close, media_type=MEDIA_TYPES[job.response_format])
            audio = await unless_disconnected(request, whole_audio(run, first))
        except ClientGone:
            close()
            return Response(status_code=CLIENT_CLOSED)
        except BaseException:
            close()
            raise
        close()
        return Response(audio, media_type=MEDIA_TYPES[job.response_format])

    return router
