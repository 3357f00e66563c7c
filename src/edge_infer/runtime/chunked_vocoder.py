"""The base of vocoder stages: codes in, PCM out, one chunk per ``chunk_tokens`` frames.

A subclass sets ``vocab_size`` in ``start`` and supplies ``synthesize``; the
chunking, the input checks and the stream bookkeeping live here. The ONNX
Runtime vocoder (``onnx_executor.py``) is one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.executors import ExecutorOptions, FrameQueue, StageExecutor, StageRequestError, StepOutput

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.runtime.config import StageConfig


class VocoderOptions(ExecutorOptions):
    sample_rate: int = Field(default=24000, ge=1)
    samples_per_token: int = Field(default=240, ge=1)
    chunk_tokens: int = Field(default=4, ge=1)


class ChunkedVocoder(StageExecutor):
    """Codes in, PCM out: one chunk per ``chunk_tokens`` frames, the remainder at the end."""

    input_contracts = frozenset({"token_ids/1", "codec_codes/1"})
    output_contracts = frozenset({"pcm_audio/1"})
    Options: Any = VocoderOptions
    vocab_size: int

    def synthesize(self, codes: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        """codes [frames, codebooks] int64 -> float32 PCM [frames * samples_per_token]."""
        raise NotImplementedError

    @classmethod
    def chunk_bytes(cls, opts: VocoderOptions) -> int:
        return opts.chunk_tokens * opts.samples_per_token * 4

    def start(self, stage: StageConfig) -> None:
        self.opts = self.options(stage)
        self.streams: dict[str, FrameQueue] = {}

    def submit(self, request_id: str, params: dict[str, Any]) -> None:
        self.streams[request_id] = FrameQueue()

    def feed(self, request_id: str, payload: Payload) -> None:
        data = np.asarray(payload.data).astype(np.int64)
        rows = data.reshape(-1, 1) if payload.contract == "token_ids/1" else data
        stream = self.streams[request_id]
        if stream.pending and stream.pending[0].shape[1] != rows.shape[1]:
            raise StageRequestError(request_id, f"codebook count changed mid-request ({stream.pending[0].shape[1]} -> {rows.shape[1]})")
        if rows.size and int(rows.max()) >= self.vocab_size:
            raise StageRequestError(request_id, f"code {int(rows.max())} is outside the vocoder's vocabulary of {self.vocab_size}")
        if len(rows):
            stream.put(rows)

    def end_input(self, request_id: str) -> None:
        self.streams[request_id].ended = True

    def _ready(self, stream: FrameQueue) -> bool:
        return stream.count >= self.opts.chunk_tokens or stream.ended

    def has_work(self) -> bool:
        return any(self._ready(s) for s in self.streams.values())

    def step(self) -> list[StepOutput]:
        out = []
        for rid, stream in list(self.streams.items()):
            if not self._ready(stream):
                continue
            payload = None
            if stream.count:
                pcm = self.synthesize(stream.take(self.opts.chunk_tokens))
                payload = Payload("pcm_audio/1", pcm.astype(np.float32, copy=False), {"sample_rate": self.opts.sample_rate, "channels": 1})
            finished = stream.ended and stream.count == 0
            out.append(StepOutput(rid, payload, finished=finished))
            if finished:
                del self.streams[rid]
        return out

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)
