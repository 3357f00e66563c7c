"""The second stage of `bench pipeline`: the runtime's chunked vocoder with a tone per token id.

It loads nothing and computes almost nothing, so the benchmark measures the
runtime around the text stage (a second process, the route, PCM chunks back
to the caller), not a vocoder. The benchmark registers it as
``tone_vocoder``; its stage process imports this module by name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from edge_infer.runtime.chunked_vocoder import ChunkedVocoder, VocoderOptions
from edge_infer.runtime.executors import ReservationPlan

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.runtime.config import StageConfig

MiB = 1 << 20


class ToneVocoderOptions(VocoderOptions):
    vocab_size: int = Field(ge=1)  # the text model's: every token id is a valid code


class ToneVocoder(ChunkedVocoder):
    kinds = frozenset({"generation"})
    Options = ToneVocoderOptions
    # RssAnon of its stage process (Python, numpy, pydantic; no torch): ~30 MiB measured, with margin.
    RUNTIME_BYTES = 48 * MiB

    @classmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        chunk = cls.chunk_bytes(cls.options(stage))
        return ReservationPlan(buffers_bytes=chunk * stage.engine.max_num_seqs, runtime_bytes=cls.RUNTIME_BYTES, max_payload_bytes=chunk)

    def start(self, stage: StageConfig) -> None:
        super().start(stage)
        self.vocab_size = self.opts.vocab_size
        self.seconds = np.arange(self.opts.samples_per_token) / self.opts.sample_rate

    def synthesize(self, codes: np.ndarray) -> np.ndarray:
        hz = 110.0 + codes[:, :1] % 880  # one pitch per frame, from its first code
        return (0.5 * np.sin(2 * np.pi * hz * self.seconds)).reshape(-1)
