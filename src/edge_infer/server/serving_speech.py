"""Serving one ``/v1/audio/speech`` request through the speech pipeline.

The response starts once the first audio chunk exists, so that a request
the pipeline fails before speaking is still an error status (503 when a
stage died, 500 otherwise); after that the status is sent and a failure
cuts the stream (an SSE stream ends with an error event instead). wav and
pcm stream chunk by chunk; flac is encoded once the audio is complete.
A client that goes away aborts the request in every stage.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import secrets
from typing import TYPE_CHECKING, AsyncIterator

import numpy as np

from edge_infer.server.errors import APIError
from edge_infer.server.speech_protocol import SpeechAudioDelta, SpeechAudioDone, SpeechUsage
from edge_infer.server.streaming import sse, sse_error
from edge_infer.tts.audio import encode, pcm16, wav_stream_header
from edge_infer.tts.timing import SpeechTiming

if TYPE_CHECKING:
    from edge_infer.server.speech_service import SpeechJob, SpeechService

_ids = itertools.count()
_prefix = secrets.token_hex(3)


class SpeechRun:
    """One request in the pipeline: its audio chunks, timing and outcome (recorded in the metrics once)."""

    def __init__(self, service: SpeechService, job: SpeechJob):
        self.service = service
        self.job = job
        self.request_id = f"speech-{_prefix}-{next(_ids)}"
        self.timing = SpeechTiming()
        self.events = service.omni.generate(job.text, request_id=self.request_id,
                                          sampling_params_list=service.pipeline.params_list(job.params))
        self.stages: dict = {}
        self.sample_rate = 24000
        self.outcome: str | None = None
        service.live.add(self)

    @property
    def frames(self) -> int:
        talker = self.stages.get(self.service.pipeline.talker_stage)
        return talker.tokens_out if talker is not None else 0

    def usage(self) -> SpeechUsage:
        return SpeechUsage(input_tokens=self.job.input_tokens, output_tokens=self.frames,
                           total_tokens=self.job.input_tokens + self.frames, audio_seconds=round(self.timing.duration_s, 3))

    async def next_audio(self) -> np.ndarray | None:
        """The next PCM chunk (float32), or None when the audio is complete."""
        while True:
            try:
                event = await self.events.__anext__()
            except StopAsyncIteration:
                self._end("finished")
                return None
            self.stages = event.metrics or self.stages
            if event.kind == "output":
                if event.payload is not None:
                    self.sample_rate = int(event.payload.metadata["sample_rate"])
                    self.timing.audio(len(event.payload.data), self.sample_rate)
                    return event.payload.data
            elif event.kind == "finished":
                self._end("finished")
                return None
            elif event.kind == "aborted":
                self._end("aborted")
                raise APIError(503, "the server is shutting down and the request did not finish within the grace period",
                               code="shutting_down")
            else:
                self._end("error")
                if not self.service.healthy():
                    raise self.service.engine_failed(f"a pipeline stage failed the request: {event.error}")
                raise APIError(500, f"the speech pipeline failed the request: {event.error}")

    def _end(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.service.metrics.observe(self.timing, outcome, self.stages, self.frames)
        self.service.live.discard(self)

    def cancel(self, reason: str) -> None:
        """Abort in every stage (server shutdown); the stream then ends with the aborted event."""
        asyncio.ensure_future(self.service.omni.abort(self.request_id))

    def close(self) -> None:
        """The response ended (or never started): abort whatever is still running."""
        if self.outcome is None:
            self._end("cancelled")
        asyncio.ensure_future(self._close_events())

    async def _close_events(self) -> None:
        try:
            await self.events.aclose()  # AsyncOmni.generate aborts an unfinished request on close
        except RuntimeError:  # a client gone before the first audio: its cancelled __anext__ is still unwinding
            await self.service.omni.abort(self.request_id)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def audio_body(run: SpeechRun, first: np.ndarray) -> AsyncIterator[bytes]:
    """wav (a header for a stream of unknown length) or pcm, chunk by chunk as they arrive."""
    if run.job.response_format == "wav":
        yield wav_stream_header(run.sample_rate)
    chunk: np.ndarray | None = first
    while chunk is not None:
        yield pcm16(chunk)
        chunk = await run.next_audio()  # an APIError here cuts the connection: the client sees a broken stream


async def sse_body(run: SpeechRun, first: np.ndarray | None) -> AsyncIterator[str]:
    """OpenAI's speech events: speech.audio.delta (base64 audio), then speech.audio.done with usage."""
    prefix = wav_stream_header(run.sample_rate) if run.job.response_format == "wav" else b""
    chunk: np.ndarray | None = first
    try:
        while chunk is not None:
            yield sse(SpeechAudioDelta(audio=_b64(prefix + pcm16(chunk))))
            prefix = b""
            chunk = await run.next_audio()
    except APIError as exc:
        yield sse_error(exc)
        return
    yield sse(SpeechAudioDone(usage=run.usage()))


async def whole_audio(run: SpeechRun, first: np.ndarray | None) -> bytes:
    """Every chunk, then one encoding with a complete header (flac, or a request that produced no audio)."""
    chunks = []
    chunk = first
    while chunk is not None:
        chunks.append(chunk)
        chunk = await run.next_audio()
    samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
    return encode(samples, run.sample_rate, run.job.response_format)
