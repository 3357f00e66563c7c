"""One request's state inside the engine core."""
from __future__ import annotations

import enum
import hashlib
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from edge_infer.engine.protocol import MediaInput, TokenLogprobs
from edge_infer.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(kw_only=True)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int] = frozenset()  # EOS (unless ignore_eos) and the request's stop_token_ids
    credits: int | None = None  # tokens it may produce ahead of its consumer; None: unbounded
    arrival_time: float = field(default_factory=time.time)
    generator: torch.Generator | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the cache
    blocks: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_preemptions: int = 0
    finish_reason: str | None = None
    stop_reason: int | None = None
    # Asked-for prompt logprobs of tokens 1.. (token 0 has none), filled as prefill computes them; recompute
    # after preemption does not score them again. Sent with the request's first delta, and then let go (a list of
    # tuples, ~1 KB a prompt token at 20 alternatives, that no plan item holds for the rest of the request).
    prompt_logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs_sent: bool = False
    # Prefix caching: the hash chain of the full blocks' tokens (tokens only append, so it only grows), how many
    # of the held blocks are cached, and how many prompt tokens the first admission found cached.
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_blocks: int = 0
    num_cached_tokens: int = 0
    # Structured output: the llguidance matcher the output must satisfy (a Future until it is built).
    grammar: Any = None
    # Media: the items, their M-RoPE positions over the prompt (None: text only, positions are indices) and the
    # delta of generated tokens, and each item's embeddings once encoded (its features are dropped then), kept
    # until the sequence ends (a recompute after preemption does not encode again).
    media: list[MediaInput] = field(default_factory=list)
    mrope_positions: np.ndarray | None = None
    mrope_delta: int = 0
    media_embeds: list[torch.Tensor | None] = field(default_factory=list)
    encode_s: float = 0.0  # seconds spent encoding its media (reported on its deltas)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    @property
    def remaining(self) -> int:
        """Tokens not yet in the cache (1 while decoding, more while prefilling)."""
        return self.num_tokens - self.num_computed

    def full_block_hashes(self, count: int, block_size: int) -> list[bytes]:
        """Hashes of the first ``count`` full blocks: each over its parent's hash and its own tokens (and, with
        media, what else its K/V depend on: ``_media_key``)."""
        while len(self.block_hashes) < count:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else b""
            start, end = i * block_size, (i + 1) * block_size
            tokens = array("q", self.token_slice(start, end)).tobytes()
            self.block_hashes.append(hashlib.blake2b(parent + tokens + self._media_key(start, end), digest_size=16).digest())
        return self.block_hashes[:count]

    def _media_key(self, start: int, end: int) -> bytes:
        """The digest of each media item with an embedding in ``start..end`` (placeholder tokens are alike for any
        image), and the M-RoPE positions of the span unless they are its token indices."""
        if not self.media:
            return b""
        key = b"".join(m.kind.encode() + m.digest for m in self.media if _overlaps(m.positions, start, end))
        positions = self.rope_positions(start, end)
        if not np.array_equal(positions[0], np.arange(start, end)) or not (positions == positions[0]).all():
            key += np.ascontiguousarray(positions).tobytes()
        return key

    def rope_positions(self, start: int, end: int) -> np.ndarray:
        """M-RoPE positions ``int64 [3, end - start]`` of tokens ``start..end``: the prompt's as computed, then
        each generated token's index plus the delta on all three axes."""
        indices = np.arange(start, end, dtype=np.int64)
        if self.mrope_positions is None:
            return np.broadcast_to(indices, (3, end - start))
        n = len(self.prompt_token_ids)
        generated = np.broadcast_to(indices[max(0, n - start):] + self.mrope_delta, (3, max(0, end - max(start, n))))
        return np.concatenate([self.mrope_positions[:, start:min(end, n)], generated], axis=1)

    def prompt_targets(self, start: int, end: int) -> range:
        """Positions in ``start..end`` whose output scores a prompt token not yet scored."""
        if self.prompt_logprobs is None or self.prompt_logprobs_sent:
            return range(0)
        return range(max(start, len(self.prompt_logprobs)), min(end, len(self.prompt_token_ids) - 1))

    @property
    def paused(self) -> bool:
        return self.credits is not None and self.credits <= 0


def _overlaps(positions: np.ndarray, start: int, end: int) -> bool:
    """Whether increasing ``positions`` hold an index in ``start..end``."""
    lo, hi = np.searchsorted(positions, (start, end))
    return bool(hi > lo)
