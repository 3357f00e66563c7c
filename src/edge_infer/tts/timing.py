"""Speech latency figures of one request: time to first audio packet (TTFP) and real-time factor.

TTFP: from submitting the request to receiving its first PCM chunk. RTF:
from submitting to receiving the last chunk, divided by the duration of the
audio produced (below 1: faster than real time).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class SpeechTiming:
    start: float = field(default_factory=time.perf_counter)
    first_audio: float | None = None
    last_audio: float | None = None
    samples: int = 0
    sample_rate: int = 24000
    chunks: int = 0

    def audio(self, samples: int, sample_rate: int) -> None:
        """Note a PCM chunk of ``samples`` samples arriving now."""
        now = time.perf_counter()
        if self.first_audio is None:
            self.first_audio = now
        self.last_audio = now
        self.samples += samples
        self.sample_rate = sample_rate
        self.chunks += 1

    @property
    def elapsed_s(self) -> float:
        """Time since submission, now."""
        return time.perf_counter() - self.start

    @property
    def ttfp_s(self) -> float | None:
        return None if self.first_audio is None else self.first_audio - self.start

    @property
    def duration_s(self) -> float:
        return self.samples / self.sample_rate

    @property
    def rtf(self) -> float | None:
        if self.last_audio is None or not self.samples:
            return None
        return (self.last_audio - self.start) / self.duration_s
