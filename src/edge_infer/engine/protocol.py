"""Messages between a frontend (LLM, LocalTextEngine, server) and the engine core.

The core speaks token ids only; text (detokenization, stop strings) lives in
the frontend. Media (images, audio, video) arrive as encoder features placed
at prompt indices (``MediaInput``). Everything here is picklable: in the
default set-up the core runs in a worker process and these travel over a
pipe, wrapped in the typed commands and reports at the end of this module.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

import numpy as np

from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.media.features import AudioFeatures, VisionFeatures
from edge_infer.models.config import MultimodalConfig
from edge_infer.models.mrope import MediaLayout, layout_problem, rope_index

# The finish reason of a request whose grammar allows no further token (none the tokenizer has can continue it).
GRAMMAR_DEAD_END = "grammar_dead_end"
# The finish reason of a request whose output met llguidance's parser limits (more than 2,000 alternatives at one
# point: a right-recursive rule 2,000 items deep, or a wide anyOf the request's check did not reach); the text is
# kept, as for a dead end, and the server's log says which limit.
GRAMMAR_LIMIT = "grammar_limit"

# One token's logprob and its top alternatives (token id, logprob).
TokenLogprobs = tuple[float, list[tuple[int, float]]]


@dataclass
class MediaEmbeddings:
    """One media item encoded elsewhere (an encoder stage, runtime/encoder_executor.py): its embedding rows, and
    the patch grid its M-RoPE positions follow (images and videos). The core places the rows as they are."""

    rows: np.ndarray  # float [num_tokens, hidden]
    grid_thw: tuple[int, int, int] | None = None  # image / video: the patch grid before merging
    second_per_grid: float | None = None  # video: seconds one temporal patch spans

    @property
    def num_tokens(self) -> int:
        return int(self.rows.shape[0]) if self.rows.ndim else 0


@dataclass
class MediaInput:
    """One image, video or audio clip of a prompt: its encoder features (or its embeddings, computed elsewhere) and
    the prompt indices its embeddings fill.

    The prompt holds one placeholder token (the model's image, video or audio pad id) per embedding row.
    ``digest`` identifies the embeddings (e.g. a hash of the features): requests whose media have equal digests
    share prefix-cache blocks, so two different media must never share one.
    """

    kind: str  # image | video | audio
    # None once the core has encoded it: a sequence keeps the embeddings (and this item's positions and digest),
    # never the encoder's input beside them.
    features: VisionFeatures | AudioFeatures | MediaEmbeddings | None
    positions: np.ndarray  # int64 prompt indices its embeddings fill, in order
    digest: bytes

    @property
    def encoded(self) -> bool:
        """Whether it comes with its embeddings (nothing to encode)."""
        return isinstance(self.features, MediaEmbeddings)

    @property
    def layout(self) -> MediaLayout:
        """Where its embeddings sit and (vision) their grid, for the M-RoPE positions: before it is encoded."""
        f = self.features
        if isinstance(f, (VisionFeatures, MediaEmbeddings)) and f.grid_thw is not None:
            return MediaLayout(self.kind, np.asarray(self.positions), tuple(f.grid_thw), f.second_per_grid)
        return MediaLayout(self.kind, np.asarray(self.positions))


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # Tokens the core may produce ahead of the consumer; None = unbounded.
    credits: int | None = None
    arrival_time: float = field(default_factory=time.time)
    # What the output must match, as llguidance's grammar text, checked by the frontend (engine/grammar.py).
    grammar: str | None = None
    media: list[MediaInput] = field(default_factory=list)
    # Multimodal RoPE (models/mrope.py): the prompt's positions int64 [3, prompt tokens] and the delta a
    # generated token adds to its index; None: the core computes them from ``media``.
    mrope_positions: np.ndarray | None = None
    mrope_delta: int = 0


def context_problem(n: int, max_tokens: int, max_model_len: int) -> str | None:
    """Why ``n`` prompt tokens and ``max_tokens`` do not fit ``max_model_len``, or None."""
    if n >= max_model_len:
        return f"the prompt has {n} tokens but max_model_len is {max_model_len}; shorten the prompt or raise --max-model-len"
    if n + max_tokens > max_model_len:
        return (f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds max_model_len "
                f"({max_model_len}); lower max_tokens to at most {max_model_len - n}")
    return None


def request_problem(prompt_ids: list[int], max_tokens: int, max_model_len: int, vocab_size: int,
                    biased_ids: Iterable[int] = ()) -> str | None:
    """Why a request cannot run, as the user should read it, or None. The frontends raise it before a request
    leaves them; the core checks it again only because code may hand it requests directly."""
    n = len(prompt_ids)
    if n == 0:
        return "the prompt is empty (0 tokens)"
    problem = context_problem(n, max_tokens, max_model_len)
    if problem is not None:
        return problem
    high, low = max(prompt_ids), min(prompt_ids)
    if high >= vocab_size or low < 0:
        return f"prompt token id {high if high >= vocab_size else low} is outside the vocabulary (ids 0 to {vocab_size - 1})"
    outside = [t for t in biased_ids if t >= vocab_size]
    if outside:
        return f"logit_bias names token id {min(outside)}, outside the vocabulary (ids 0 to {vocab_size - 1})"
    return None


def media_problem(prompt_ids: list[int], media: Sequence[MediaInput], multimodal: MultimodalConfig | None,
                  model: str) -> str | None:
    """Why ``media`` cannot go with this prompt to ``model`` (its architecture name), or None; checked with
    request_problem, on every prompt to a multimodal model (a placeholder token needs its media)."""
    if multimodal is None:
        return f"{model} takes text only; it cannot take {media[0].kind} input" if media else None
    for k, m in enumerate(media):
        what = f"media item {k} ({m.kind})"
        if m.kind not in multimodal.kinds:
            return f"{what}: {model} takes {', '.join(multimodal.kinds)}"
        want = AudioFeatures if m.kind == "audio" else VisionFeatures
        if isinstance(m.features, MediaEmbeddings):
            problem = _embeddings_problem(m.features, m.kind, multimodal)
            if problem is not None:
                return f"{what}: {problem}"
        elif not isinstance(m.features, want):
            return f"{what}: features must be {want.__name__} or MediaEmbeddings, not {type(m.features).__name__}"
        if not isinstance(m.digest, bytes) or not m.digest:
            return f"{what}: digest must be non-empty bytes that identify the media (prefix caching keys on it)"
        if isinstance(m.features, VisionFeatures) and m.features.merge_size != multimodal.spatial_merge_size:
            return (f"{what}: features merged {m.features.merge_size}x{m.features.merge_size} patches, the model "
                    f"merges {multimodal.spatial_merge_size}x{multimodal.spatial_merge_size}")
        if m.features.num_tokens != len(m.positions):
            return f"{what}: its features give {m.features.num_tokens} embeddings, but {len(m.positions)} positions are given"
    return layout_problem(prompt_ids, [m.layout for m in media], multimodal)


def _embeddings_problem(e: MediaEmbeddings, kind: str, multimodal: MultimodalConfig) -> str | None:
    rows = e.rows
    hidden = multimodal.vision.out_hidden_size  # the decoder's width (models/config.py checks every tower's)
    if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.shape[1] != hidden:
        return f"embeddings must be [tokens, {hidden}] (the model's hidden size), not {list(np.shape(rows))}"
    if rows.dtype.kind != "f":
        return f"embeddings must be floating point, not {rows.dtype}"
    if kind == "audio" and e.grid_thw is not None:
        return "an audio clip's embeddings have no patch grid"
    return None


def mrope_positions(prompt_ids: list[int], media: Sequence[MediaInput], multimodal: MultimodalConfig) -> tuple[np.ndarray, int]:
    """The prompt's M-RoPE positions and delta (models/mrope.py) for media that passed ``media_problem``."""
    return rope_index(len(prompt_ids), [m.layout for m in media], multimodal)


@dataclass
class TokenDelta:
    """One request's progress in one step: a new token, an end, or both."""

    request_id: str
    token_id: int | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    prompt_logprobs: list[TokenLogprobs] | None = None  # prompt tokens 1.., on the request's first delta
    finished: bool = False
    finish_reason: str | None = None  # stop | length | abort | error
    stop_reason: int | None = None  # the stop token id, when one ended the request
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    num_preemptions: int = 0
    encode_s: float = 0.0  # seconds the core has spent encoding this request's media so far
    error: str | None = None


@dataclass
class CoreStats:
    num_waiting: int = 0
    num_running: int = 0
    # the most queued at once since the core started (LLM.generate: at most 2 x max_num_seqs, or one prompt's n)
    num_waiting_peak: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    num_preemptions: int = 0
    prompt_tokens_computed: int = 0  # prompt tokens run through the model (cache hits are not)
    prefix_cache_query_tokens: int = 0  # tokens of admitted sequences looked up in the prefix cache
    prefix_cache_hit_tokens: int = 0  # of those, found in cached blocks
    prefix_cache_evictions: int = 0  # cached blocks reused for other tokens
    kv_blocks_cached: int = 0  # blocks findable by prefix (held or not)
    media_encoded: int = 0  # media items run through an encoder
    media_sequences: int = 0  # sequences holding media (inputs or embeddings), queued or running
    media_sequences_peak: int = 0  # the most at once since the core started (the plan holds max_num_seqs)
    generated_tokens: int = 0
    steps: int = 0


@dataclass
class ReadyInfo:
    """What the core reports once loaded: the figures a plan is checked against."""

    pid: int
    dtype: str
    weight_bytes: int
    decode_read_bytes: int  # weight bytes one decode step reads (the embedding table is one row)
    kv_cache_bytes: int
    kv_blocks: int
    rope_bytes: int
    weight_kernels: dict[str, int]  # kernel name -> linears holding it
    # linear kind (decoder linears, output head, embedding lookup; encoder linears of a thinker) -> kernel
    linear_kernels: dict[str, str]
    num_threads: int
    load_s: float
    trimmed_bytes: int
    # A thinker's towers (vision, audio) -> their resident weight bytes, part of weight_bytes.
    encoder_weight_bytes: dict[str, int] = field(default_factory=dict)


# frontend -> core (engine/worker.py)


@dataclass
class AddRequest:
    request: EngineRequest


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class GrantCredits:
    request_id: str
    credits: int


@dataclass
class StatsQuery:
    pass


@dataclass
class Shutdown:
    pass


Command = Union[AddRequest, AbortRequests, GrantCredits, StatsQuery, Shutdown]


# core -> frontend


@dataclass
class LoadProgress:
    done: int
    total: int


@dataclass
class InitFailed:
    """The core could not load: the exception's class name and text, and where it came from."""

    error_type: str
    message: str
    traceback: str


@dataclass
class Ready:
    info: ReadyInfo


@dataclass
class Deltas:
    deltas: list[TokenDelta]
    stats: CoreStats


@dataclass
class Stats:
    stats: CoreStats


@dataclass
class Heartbeat:
    step_busy_s: float  # how long the running step has taken so far; 0 between steps


Report = Union[LoadProgress, InitFailed, Ready, Deltas, Stats, Heartbeat]
