"""Code2Wav's layer shapes as numbers (torch-free): kernel sizes, carried state, activation bounds.

The memory planner sizes a Code2Wav stage from these without building the
model; ``code2wav.py`` builds the layers from the same constants.
"""
from __future__ import annotations

from edge_infer.models.qwen3_tts.config import Code2WavConfig

PRE_CONV_KERNEL = 3
CONVNEXT_KERNEL = 7
DECODER_KERNEL = 7  # the first and last convs of the decoder, and each residual unit's first conv
RESIDUAL_DILATIONS = (1, 3, 9)
# Speech-tokenizer tensors decoding does not need: the codec's encoder (audio -> codes, for voice
# cloning) and the quantizers' encoder-side input projections.
NOT_FOR_DECODING = ("encoder.", "decoder.quantizer.rvq_first.input_proj", "decoder.quantizer.rvq_rest.input_proj")
# Transient tensors of a decode, in units of the largest block output (see decode_activation_bytes).
ACTIVATION_LARGEST = 6


def decoder_dims(config: Code2WavConfig) -> list[int]:
    """Channels before and after each SnakeBeta decoder block (halved per block)."""
    return [config.decoder_dim // 2 ** i for i in range(len(config.upsample_rates) + 1)]


def decode_state_bytes(config: Code2WavConfig, dtype_bytes: int) -> int:
    """Bytes one stream carries between chunks (``code2wav.DecodeState``).

    Each causal conv keeps its last ``(kernel - 1) * dilation`` input
    columns, each SnakeBeta block's transposed conv its last input column,
    and the transformer its last ``window - 1`` keys and values per layer.
    """
    dims = decoder_dims(config)
    columns = (PRE_CONV_KERNEL - 1) * config.codebook_dim
    columns += len(config.upsampling_ratios) * (CONVNEXT_KERNEL - 1) * config.latent_dim
    columns += (DECODER_KERNEL - 1) * config.latent_dim
    for cin, cout in zip(dims, dims[1:]):
        columns += cin + sum((DECODER_KERNEL - 1) * d for d in RESIDUAL_DILATIONS) * cout
    columns += (DECODER_KERNEL - 1) * dims[-1]
    t = config.transformer
    kv = 2 * t.num_layers * (config.sliding_window - 1) * t.num_kv_heads * t.head_dim
    return (columns + kv) * dtype_bytes


def decode_activation_bytes(config: Code2WavConfig, frames: int, dtype_bytes: int) -> int:
    """A bound on the transient bytes of decoding ``frames`` frames at once.

    The largest tensors are the decoder blocks' outputs (channels x
    samples). The peak comes in the last block's residual units: the
    block's input (held by the caller), the unit's input, its SnakeBeta
    output, that output extended by the carried columns, and the conv
    output; measured 4.9 of the largest at 8 and 33 frames of the 0.6B
    shapes (``tests/models/test_code2wav_activation_bound.py``). The bound
    allows ``ACTIVATION_LARGEST`` of them, plus the fp32 PCM.
    """
    dims = decoder_dims(config)
    steps = frames
    for ratio in config.upsampling_ratios:
        steps *= ratio
    largest = max(config.latent_dim, dims[0]) * steps
    for rate, cout in zip(config.upsample_rates, dims[1:]):
        steps *= rate
        largest = max(largest, cout * steps)
    return ACTIVATION_LARGEST * largest * dtype_bytes + 4 * frames * config.samples_per_frame
