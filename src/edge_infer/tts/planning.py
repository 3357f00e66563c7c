"""Settings and memory reservations of the two Qwen3-TTS stages, from configs and headers (torch-free).

The deploy planner calls the executors' ``plan`` in the parent process
before anything loads; both reservations come from here, and the executors
build their engines from the same resolved settings, so what is booked in
the shared-RAM ledger is what the stage allocates.

Talker (``ar``): weights (decoder, code predictor, text side) as resident in
the stage's dtype or int4; KV = the paged cache's exact bytes (whole blocks
of ``kv_cache_memory_bytes``) + the code predictor's cache (one block of
``num_code_groups`` positions per running request); buffers = one step's
activations, RoPE tables and the requests' prompt and frame embeddings.

Code2Wav (``generation``): weights of ``decoder.*``; KV = each stream's
carried decode state (the causal layers' last inputs and the transformer's
last ``window - 1`` keys/values); buffers = the activations of decoding one
chunk.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_infer.config import QUANTIZATION_CHOICES, EngineConfig, QuantConfig
from edge_infer.models.layers.kv_cache import DEFAULT_BLOCK_SIZE, KVLayout
from edge_infer.hardware.cpu import detect
from edge_infer.hardware.kernels import select_kernels
from edge_infer.memory.sizing import activation_bytes, activation_calibration, resolve_dtype, runtime_overhead
from edge_infer.models.checkpoint import read_tensor_index
from edge_infer.models.qwen3_tts.code2wav_shapes import NOT_FOR_DECODING, decode_activation_bytes, decode_state_bytes
from edge_infer.models.qwen3_tts.config import Code2WavConfig, Qwen3TTSConfig, load_code2wav_config, load_config
from edge_infer.models.qwen3_tts.layout import SPEECH_TOKENIZER_DIR
from edge_infer.models.weights import WeightSpec
from edge_infer.runtime.executors import ReservationPlan
from edge_infer.models.qwen3_tts.talker_weights import predictor_decoder_config, predictor_specs, talker_decoder_config, talker_specs, text_side_numel

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.runtime.config import StageConfig

DEFAULT_MAX_MODEL_LEN = 2048  # Talker positions: prompt + frames (2000 frames = 160 s of audio)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
CODE_BYTES = 8  # codec_codes/1 travels as int64
PCM_BYTES = 4  # pcm_audio/1 is float32
MiB = 1 << 20
# A stage process beyond an engine worker (memory/overhead.json worker_bytes): the runtime's modules
# (pydantic, yaml, transport), conv and matmul scratch, allocator arenas. Measured RssAnon in all for a
# tiny-model stage: 150-158 MiB in fp32, up to 175 MiB for a bf16 Code2Wav (oneDNN's bf16 convolution
# kernels and scratch); checked in both dtypes by tests/tts/test_tts_pipeline.py.
STAGE_EXTRA_BYTES = 40 * MiB
# Each distinct decode length leaves its convolutions' oneDNN primitives (JIT kernels, tile configurations,
# scratch) in the process's primitive cache for good. RssAnon per length, the heap trimmed, at the released
# Code2Wav's shapes (a synthesized 0.6B checkpoint) on a Xeon with AMX, 2026-12-05: bf16 on AMX tiles
# 10-14 MiB (the tiny shapes alike), fp32 2-6 MiB (AVX-512, and under the AVX2 mask), bf16 under the AVX2
# mask (tiny) under 1 MiB. ARM is unmeasured: it takes "other".
CONV_KERNEL_BYTES_PER_LENGTH = {"amx": 15 * MiB, "other": 6 * MiB}


def stage_runtime_bytes() -> int:
    return runtime_overhead()["worker_bytes"] + STAGE_EXTRA_BYTES


def conv_kernel_bytes(dtype: str, lengths: int) -> int:
    """What ``lengths`` distinct decode lengths leave in oneDNN's primitive cache."""
    amx = dtype == "bfloat16" and detect().has("amx_bf16")
    return lengths * CONV_KERNEL_BYTES_PER_LENGTH["amx" if amx else "other"]


def decode_lengths(max_chunk_frames: int) -> list[int]:
    """The frame counts Code2Wav decodes at once: the powers of two below ``max_chunk_frames``, and it.

    Decoding whatever has arrived would run up to ``max_chunk_frames`` sets of convolution shapes, each cached
    by oneDNN for the life of the process (``conv_kernel_bytes``); these few bound it. 7 frames decode as 4, 2
    and 1, in three steps.
    """
    return [1 << k for k in range(max_chunk_frames.bit_length()) if 1 << k < max_chunk_frames] + [max_chunk_frames]


def decode_piece(pending: int, max_chunk_frames: int) -> int:
    """How many of ``pending`` (>= 1) frames to decode now: the largest of ``decode_lengths`` that fits."""
    return max(n for n in decode_lengths(max_chunk_frames) if n <= pending)


def distinct_decode_shapes(max_chunk_frames: int, left_context_frames: int | None) -> int:
    """Distinct input lengths Code2Wav's convolutions see: one per decode length with a carried state; with a
    left context each piece follows 0..N earlier frames (fewer at a stream's start)."""
    pieces = len(decode_lengths(max_chunk_frames))
    if left_context_frames is None:
        return pieces
    return min(pieces * (left_context_frames + 1), left_context_frames + max_chunk_frames)


def stage_threads(requested: int | None, share: int) -> int:
    """Threads of one TTS stage: as asked, else ``1 / share`` of the cores this process may use."""
    return requested or max(1, len(os.sched_getaffinity(0)) // share)


def _require_model(stage: "StageConfig") -> Path:
    if not stage.model:
        raise ValueError(f"{stage.label} needs model: the Qwen3-TTS checkpoint directory")
    return Path(stage.model)


def _quant(name: str | None, dtype: str) -> QuantConfig | None:
    if name in (None, "none"):
        return None
    if name not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization {name!r} is not supported for the Talker; use {', '.join(QUANTIZATION_CHOICES)}")
    refusals = select_kernels(detect(), dtype, name).refusals
    if refusals:
        raise ValueError(f"the Talker's {refusals[0]}")
    try:
        import edge_infer.quant.install  # noqa: F401 - the int4 installer the Talker loads through
    except ImportError:
        raise ValueError(f"quantization {name} needs edge_infer.quant, which this build lacks; drop quantization:") from None
    return QuantConfig.named(name)


def talker_engine_config(stage: "StageConfig") -> EngineConfig:
    """The Talker's resolved engine settings (defaults filled in)."""
    model = _require_model(stage)
    engine = stage.engine
    if engine.quantization == "auto" or (engine.quantization is None and engine.priority is not None):
        from edge_infer.memory.weight_path import first_runnable

        engine = engine.model_copy(update={"quantization": first_runnable(engine.priority, detect()).quantization})
    quantization = None if engine.quantization in (None, "none") else engine.quantization
    dtype = resolve_dtype(engine.dtype, [], quantization)
    max_model_len = engine.max_model_len or DEFAULT_MAX_MODEL_LEN
    max_num_batched_tokens = engine.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if engine.max_num_seqs > max_num_batched_tokens:
        raise ValueError(f"max_num_seqs ({engine.max_num_seqs}) exceeds max_num_batched_tokens ({max_num_batched_tokens})")
    layout = talker_kv_layout(load_config(model), dtype)
    # Unset: room for every running request at full length.
    kv = engine.kv_cache_memory_bytes
    if kv is None:
        kv = engine.max_num_seqs * layout.blocks_for_tokens(max_model_len) * layout.bytes_per_block
    return EngineConfig(
        model=str(model), dtype=dtype, max_model_len=max_model_len, max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, kv_cache_memory_bytes=kv, block_size=layout.block_size,
        quant=_quant(engine.quantization, dtype),
    )


def talker_kv_layout(config: Qwen3TTSConfig, dtype: str) -> KVLayout:
    shape = config.talker.shape
    return KVLayout(shape.num_layers, shape.num_kv_heads, shape.head_dim, DTYPE_BYTES[dtype], DEFAULT_BLOCK_SIZE)


def _spec_bytes(specs: list[WeightSpec], dtype_bytes: int, quant: QuantConfig | None) -> int:
    total = 0
    for spec in specs:
        # As the int4 installer does: every linear but the Talker's codec head (unless quantize_head).
        if spec.is_linear and quant is not None and (spec.target != "lm_head" or quant.quantize_head):
            from edge_infer.quant.sizes import linear_nbytes

            total += linear_nbytes(spec, quant, dtype_bytes)
        else:
            total += spec.numel * dtype_bytes
    return total


@dataclass(frozen=True)
class TalkerBytes:
    weights: int
    kv: int
    buffers: int


def talker_bytes(config: Qwen3TTSConfig, engine: EngineConfig) -> TalkerBytes:
    dtype_bytes = DTYPE_BYTES[engine.dtype]
    talker = config.talker
    decoder = talker_decoder_config(config, engine.max_model_len, engine.dtype)
    predictor = predictor_decoder_config(config, engine.dtype)
    weights = (
        _spec_bytes(talker_specs(decoder), dtype_bytes, engine.quant)
        + _spec_bytes(predictor_specs(predictor, talker.shape.hidden_size, talker.num_code_groups), dtype_bytes, engine.quant)
        + text_side_numel(config) * dtype_bytes
    )
    layout = talker_kv_layout(config, engine.dtype)
    pshape = talker.code_predictor.shape
    predictor_kv = engine.max_num_seqs * talker.num_code_groups * 2 * pshape.num_layers * pshape.num_kv_heads * pshape.head_dim * dtype_bytes
    kv = layout.blocks_for_budget(engine.kv_cache_memory_bytes) * layout.bytes_per_block + predictor_kv
    rope = 2 * 4 * (engine.max_model_len * talker.shape.head_dim + talker.num_code_groups * pshape.head_dim)
    # Prompt rows and fed-back frames of every running request, one hidden vector per position.
    embeddings = engine.max_num_seqs * engine.max_model_len * talker.shape.hidden_size * dtype_bytes
    # The predictor runs within the Talker's step: its activations, but the step's fixed scratch only once.
    quantization = engine.quant.method if engine.quant is not None else None
    predictor_acts = activation_bytes(
        predictor, dtype_bytes, 2 * engine.max_num_seqs, engine.max_num_seqs, talker.num_code_groups, quantization,
    )
    buffers = (
        activation_bytes(decoder, dtype_bytes, engine.max_num_batched_tokens, engine.max_num_seqs, engine.max_model_len,
                         quantization)
        + predictor_acts - activation_calibration(quantization)[1] + rope + embeddings
    )
    return TalkerBytes(weights, kv, buffers)


def tokenizer_bytes(model: Path) -> int:
    """RssAnon of the loaded text tokenizer, from its files' size (measured ratio, memory/overhead.json)."""
    files = [model / "tokenizer.json"] if (model / "tokenizer.json").is_file() else [model / "vocab.json", model / "merges.txt"]
    size = sum(f.stat().st_size for f in files if f.is_file())
    return int(runtime_overhead()["tokenizer_bytes_per_json_byte"] * size)


def talker_reservation(stage: "StageConfig", max_chunk_frames: int) -> ReservationPlan:
    engine = talker_engine_config(stage)
    config = load_config(engine.model)
    sizes = talker_bytes(config, engine)
    return ReservationPlan(
        weights_bytes=sizes.weights, kv_bytes=sizes.kv, buffers_bytes=sizes.buffers,
        runtime_bytes=stage_runtime_bytes() + tokenizer_bytes(Path(engine.model)),
        max_payload_bytes=max_chunk_frames * config.talker.num_code_groups * CODE_BYTES,
    )


@dataclass(frozen=True)
class Code2WavSettings:
    model: str
    dtype: str
    max_num_seqs: int


def code2wav_settings(stage: "StageConfig") -> Code2WavSettings:
    return Code2WavSettings(str(_require_model(stage)), resolve_dtype(stage.engine.dtype, []), stage.engine.max_num_seqs)


def code2wav_weight_bytes(model: Path, dtype_bytes: int) -> int:
    """The speech tokenizer's tensors that decoding loads (``decoder.*`` less ``NOT_FOR_DECODING``)."""
    index = read_tensor_index(model / SPEECH_TOKENIZER_DIR)
    numel = sum(math.prod(info.shape) for name, info in index.items()
                if name.startswith("decoder.") and not name.startswith(NOT_FOR_DECODING))
    return numel * dtype_bytes


def code2wav_reservation(stage: "StageConfig", max_chunk_frames: int, left_context_frames: int | None) -> ReservationPlan:
    settings = code2wav_settings(stage)
    config: Code2WavConfig = load_code2wav_config(settings.model)
    dtype_bytes = DTYPE_BYTES[settings.dtype]
    decoded = max_chunk_frames + (left_context_frames or 0)
    # Context mode keeps each stream's last frames (codes) instead of a decode state.
    per_stream = decode_state_bytes(config, dtype_bytes) if left_context_frames is None else left_context_frames * config.num_quantizers * CODE_BYTES
    return ReservationPlan(
        weights_bytes=code2wav_weight_bytes(Path(settings.model), dtype_bytes),
        kv_bytes=settings.max_num_seqs * per_stream,
        buffers_bytes=decode_activation_bytes(config, decoded, dtype_bytes),
        runtime_bytes=stage_runtime_bytes()
        + conv_kernel_bytes(settings.dtype, distinct_decode_shapes(max_chunk_frames, left_context_frames)),
        max_payload_bytes=max_chunk_frames * config.samples_per_frame * PCM_BYTES,
    )
