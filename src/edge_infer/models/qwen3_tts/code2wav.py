"""Code2Wav: the 12 Hz speech tokenizer's decoder, codec codes -> 24 kHz PCM.

Pipeline for T frames of Q codes::

    split residual VQ   codebook 0 and codebooks 1..Q-1 each summed, projected (1x1 conv), added
                        -> [codebook_dim, T]
    pre_conv            causal conv, k=3 -> [latent_dim, T]
    pre_transformer     linear in, sliding-window causal transformer, linear out -> [latent_dim, T]
    upsample            per ratio: causal transposed conv (stride = ratio) + ConvNeXt block
    decoder             causal conv to decoder_dim, then per rate: SnakeBeta + causal
                        transposed conv (halving channels) + 3 dilated residual units (1, 3, 9),
                        SnakeBeta, causal conv to 1 channel, clamp to [-1, 1]

Everything is causal, so audio up to frame t depends only on frames <= t.
Two ways to decode a stream of chunks follow from that:

- carry a ``DecodeState`` (``Code2Wav.forward(codes, state)``): every causal
  layer keeps the last inputs its kernel reaches back to, the transformer
  its last ``window - 1`` keys/values, so each frame is decoded once and
  the chunks join exactly as one whole-utterance decode;
- recompute a left context (``StreamingDecoder``, what the reference does):
  each chunk is decoded after up to ``left_context`` earlier frames, exact
  only with ``receptive_field_frames`` of them.

Module attributes mirror the checkpoint's ``decoder.*`` weight names.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.models.layers.linear import onednn_bf16_available
from edge_infer.models.loader import load_module
from edge_infer.models.qwen3_tts.code2wav_shapes import (
    CONVNEXT_KERNEL, DECODER_KERNEL, NOT_FOR_DECODING, PRE_CONV_KERNEL, RESIDUAL_DILATIONS, decoder_dims,
)
from edge_infer.models.qwen3_tts.config import Code2WavConfig
from edge_infer.models.qwen3_tts.layers import DecoderStack, SlidingKVCache
from edge_infer.models.qwen3_tts.layout import SPEECH_TOKENIZER_DIR

CODEBOOK_EPS = 1e-5
SNAKE_EPS = 1e-9


class DecodeState:
    """One stream's carried context: each causal layer's last inputs, the transformer's recent keys.

    At the start every layer sees zeros before the first frame, as the
    whole decode's left padding does.
    """

    def __init__(self, config: Code2WavConfig) -> None:
        self.tails: dict[nn.Module, torch.Tensor] = {}
        self.kv = SlidingKVCache(config.transformer.num_layers, config.sliding_window - 1)

    @property
    def frames(self) -> int:
        """Frames decoded so far."""
        return self.kv.start

    def extend(self, layer: nn.Module, x: torch.Tensor, left: int) -> torch.Tensor:
        """``x`` [1, C, n] preceded by the ``left`` columns ``layer`` saw last; keeps the new last ``left``."""
        if left == 0:
            return x
        tail = self.tails.get(layer)
        if tail is None:
            tail = x.new_zeros(x.shape[0], x.shape[1], left)
        full = torch.cat((tail, x), dim=-1)
        self.tails[layer] = full[..., full.shape[-1] - left:].clone()
        return full


class Codebook(nn.Module):
    """EMA-style codebook: the entries are embedding_sum / cluster_usage."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        table = self.embedding_sum / self.cluster_usage.clamp(min=CODEBOOK_EPS)[:, None]
        return F.embedding(codes, table)


class VectorQuantizer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(size, dim)


class _Layers(nn.Module):
    def __init__(self, count: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VectorQuantizer(size, dim) for _ in range(count))


class ResidualVQ(nn.Module):
    def __init__(self, count: int, size: int, dim: int, out_dim: int) -> None:
        super().__init__()
        self.vq = _Layers(count, size, dim)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [Q, T] -> [1, out_dim, T]."""
        total = self.vq.layers[0]._codebook(codes[0])
        for layer, layer_codes in zip(self.vq.layers[1:], codes[1:]):
            total = total + layer._codebook(layer_codes)
        return self.output_proj(total.t()[None])


class SplitResidualVQ(nn.Module):
    """Codebook 0 (semantic) and the acoustic rest, each with its own projection."""

    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        dim = config.codebook_dim // 2
        self.rvq_first = ResidualVQ(1, config.codebook_size, dim, config.codebook_dim)
        self.rvq_rest = ResidualVQ(config.num_quantizers - 1, config.codebook_size, dim, config.codebook_dim)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first(codes[:1]) + self.rvq_rest(codes[1:])


# A conv over at most in_channels / FEW_COLUMNS_RATIO columns runs as one product that streams its weight
# (``F.linear`` on the unfolded input); over more, PyTorch's oneDNN conv is faster. Measured fp32, AVX2, one
# thread: the decoder's first conv (1024 -> 1536 channels, k = 7) at a 4-frame chunk's 16 columns takes
# 39 ms as conv1d and 10 ms as the product; a 768-channel residual conv at 32 columns 5.3 vs 4.8 ms, at
# 128 columns the two are equal, at 256 the conv is 1.2x faster.
FEW_COLUMNS_RATIO = 8
# The rows oneDNN's blocked product weight is laid out for: a 4- to 8-frame chunk's input columns.
PACKED_PRODUCT_ROWS = 16
# The chunk the layouts are chosen for: the stream's default (runtime/configs/qwen3_tts.yaml's chunk_frames).
LAYOUT_CHUNK_FRAMES = 4


def few_columns(columns: int, in_channels: int) -> bool:
    return columns * FEW_COLUMNS_RATIO <= in_channels


class CausalConv(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.left = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        x = F.pad(x, (self.left, 0)) if state is None else state.extend(self, x, self.left)
        conv = self.conv
        columns = x.shape[-1] - self.left
        if conv.kernel_size[0] == 1 and conv.groups == 1 and x.shape[0] == 1:
            # A pointwise conv is one product; PyTorch's conv1d sends it to its slow (non-oneDNN) path, 10-30%
            # slower at the residual units' shapes (fp32, AVX2, one thread).
            return torch.addmm(conv.bias[:, None], conv.weight[:, :, 0], x[0])[None]
        if conv.groups > 1 or x.shape[0] > 1 or not few_columns(columns, conv.in_channels):
            return conv(x)
        weight = conv.weight  # [cout, cin, k]: its [cout, cin * k] view matches the unfolded rows' order
        cout, cin, kernel = weight.shape
        rows = x[0].unfold(1, self.left + 1, 1)[:, :, :: conv.dilation[0]]  # [cin, columns, k]
        rows = rows.permute(1, 0, 2).reshape(columns, cin * kernel)
        return F.linear(rows, weight.reshape(cout, cin * kernel), conv.bias).t()[None]


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN's blocked linear runs ``dtype`` here: fp32 wherever oneDNN is built in, bf16 only where this
    CPU has it (oneDNN refuses to reorder bf16 weights without AVX-512 or AVX-NE-CONVERT)."""
    if dtype == torch.bfloat16:
        return onednn_bf16_available()
    return dtype == torch.float32 and torch.backends.mkldnn.is_available()


class CausalTransposedConv(nn.Module):
    """Upsample by ``stride``; the tail that would reach past the input's end is cut.

    With ``kernel = taps * stride`` output block ``t`` (``stride`` samples)
    sums tap ``m`` of input ``t - m``; ``taps - 1`` earlier inputs (zeros
    at the start, or the stream's last ones) make every block complete.
    Neither way below is ``conv_transpose1d``, whose CPU path runs these
    shapes several times below the core's product rate. Two ways, by layout:

    - the checkpoint's ``[cin, cout * kernel]`` weight, one product per
      call with time first (each input column times the whole weight, read
      once: what few columns want), then the taps summed over rows; after
      ``pack()`` the weight is held in oneDNN's blocked layout (where
      oneDNN runs), which PyTorch's GEMM would otherwise re-pack on every
      call: the first decoder block's 75 MB weight at 17 and 33 columns in
      14-16 and 23 ms instead of 23-25 and 27-42 (fp32, AVX2, one thread);
    - after ``pack()`` on a layer built with ``polyphase``: output phase
      ``p`` of channel ``c`` is an ordinary causal conv of the input with
      taps ``weight[:, c, m * stride + p]``, so the whole layer is one
      oneDNN conv to ``cout * stride`` channels, then the phases
      interleaved. Over many columns (the last decoder blocks': 32-640 per
      frame) it runs 1.2-1.6x faster than the product (fp32, AVX2).
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, polyphase: bool = False) -> None:
        super().__init__()
        if kernel % stride:
            raise ValueError(f"transposed conv kernel {kernel} is not a multiple of its stride {stride}")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.taps = kernel // stride
        # Earlier inputs whose kernels still reach into the current input's outputs.
        self.history = self.taps - 1
        self.polyphase = polyphase
        self.phases: nn.Parameter | None = None  # [cout * stride, cin, taps] once packed
        self.product: nn.Parameter | None = None  # the product's weight [cout * kernel, cin] for oneDNN, once packed

    def pack(self) -> None:
        """Rearrange the weight into the layout this layer multiplies with (replacing it, not copying)."""
        if self.phases is not None or self.product is not None:
            return
        if not self.polyphase:
            if onednn_packs(self.conv.weight.dtype):
                weight = self.conv.weight  # [cin, cout, kernel]
                self.cout = weight.shape[1]
                rows = weight.reshape(weight.shape[0], -1).t().contiguous()
                self.product = nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(rows, PACKED_PRODUCT_ROWS),
                                            requires_grad=False)
                self.bias = self.conv.bias
                del self.conv, rows
            return
        weight = self.conv.weight  # [cin, cout, taps * stride]
        cin, cout = weight.shape[0], weight.shape[1]
        taps = weight.view(cin, cout, self.taps, self.stride).flip(2)  # conv1d's tap j reaches input t - (history - j)
        self.phases = nn.Parameter(taps.permute(1, 3, 0, 2).reshape(cout * self.stride, cin, self.taps).contiguous(),
                                   requires_grad=False)
        self.bias = self.conv.bias
        del self.conv

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        """[1, cin, n] -> [1, cout, n * stride]."""
        n, h = x.shape[-1], self.history
        x = F.pad(x, (h, 0)) if state is None else state.extend(self, x, h)
        if self.phases is not None:
            return self._polyphase(x, n)
        if self.product is not None:
            cout, bias = self.cout, self.bias
            product = torch.ops.mkldnn._linear_pointwise(x[0].t().contiguous(), self.product, None, "none", [], "")
        else:
            weight, bias = self.conv.weight, self.conv.bias  # [cin, cout, kernel]
            cout = weight.shape[1]
            product = x[0].t() @ weight.reshape(weight.shape[0], -1)
        blocks = product.view(n + h, cout, self.taps, self.stride)
        del x, product  # the extended copy; dropping it and the product early keeps the decode's peak down
        out = torch.add(blocks[h:, :, 0], bias.view(1, -1, 1))  # [n, cout, stride]
        for m in range(1, self.taps):
            out += blocks[h - m: h - m + n, :, m]
        del blocks
        return out.permute(1, 0, 2).reshape(1, cout, n * self.stride)

    def _polyphase(self, x: torch.Tensor, n: int) -> torch.Tensor:
        cout = self.bias.shape[0]
        phases = F.conv1d(x, self.phases).view(cout, self.stride, n)
        del x
        out = torch.empty(cout, n, self.stride, dtype=phases.dtype)
        torch.add(phases.transpose(1, 2), self.bias.view(-1, 1, 1), out=out)  # interleave the phases, add the bias
        return out.view(1, cout, n * self.stride)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, CONVNEXT_KERNEL, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        h = self.dwconv(x, state).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, per channel (alpha, beta stored as logs)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        # The native kernel's ISA variant (``Code2Wav.pack``): fp32 in one vectorized pass instead of four.
        self.kernel_variant: str | None = None

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:  # pointwise: no state
        alpha = torch.exp(self.alpha)
        inverse_beta = 1.0 / (torch.exp(self.beta) + SNAKE_EPS)
        if self.kernel_variant is not None and x.dtype == torch.float32 and x.shape[0] == 1:
            return torch.ops.edge_infer.snake(x.contiguous(), alpha, inverse_beta, self.kernel_variant)
        # One new tensor, updated in place: 1.3-4x faster than the formula's four temporaries, same bits.
        wave = torch.mul(x, alpha[None, :, None]).sin_()
        return wave.square_().mul_(inverse_beta[None, :, None]).add_(x)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, DECODER_KERNEL, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), state)), state)


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int, polyphase: bool) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalTransposedConv(cin, cout, 2 * rate, rate, polyphase)]
            + [ResidualUnit(cout, d) for d in RESIDUAL_DILATIONS]
        )

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, state)
        return x


class PreTransformer(DecoderStack):
    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__(config.transformer)
        self.input_proj = nn.Linear(config.latent_dim, config.transformer.hidden_size)
        self.output_proj = nn.Linear(config.transformer.hidden_size, config.latent_dim)
        self.window = config.sliding_window

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:  # type: ignore[override]
        """[T, latent] -> [T, latent], sliding-window causal attention (from position 0, or after the state's frames)."""
        cache = state.kv if state is not None else None
        out = self.output_proj(super().forward(self.input_proj(x), cache, self.window))
        if cache is not None:
            cache.advance(x.shape[0])
        return out


class Code2Wav(nn.Module):
    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        self.config = config
        self.quantizer = SplitResidualVQ(config)
        self.pre_conv = CausalConv(config.codebook_dim, config.latent_dim, PRE_CONV_KERNEL)
        self.pre_transformer = PreTransformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransposedConv(config.latent_dim, config.latent_dim, r, r), ConvNeXtBlock(config.latent_dim)])
            for r in config.upsampling_ratios
        )
        dims = decoder_dims(config)
        # Each block's transposed conv takes the layout that is faster for its input columns at a typical chunk.
        columns = LAYOUT_CHUNK_FRAMES * math.prod(config.upsampling_ratios)
        polyphase = []
        for i, rate in enumerate(config.upsample_rates):
            polyphase.append(not few_columns(columns, dims[i]))
            columns *= rate
        self.decoder = nn.ModuleList(
            [CausalConv(config.latent_dim, config.decoder_dim, DECODER_KERNEL)]
            + [DecoderBlock(dims[i], dims[i + 1], rate, polyphase[i]) for i, rate in enumerate(config.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, DECODER_KERNEL)]
        )

    def pack(self, snake_variant: str | None = None) -> "Code2Wav":
        """Rearrange loaded weights into the layouts the layers decode fastest with (once, after loading).

        ``snake_variant``: the native library's ISA variant (``quant.native.vector_variant``, chosen by the
        caller: models sit below quant) for an fp32 decoder's SnakeBeta layers; None keeps PyTorch's operators.
        """
        if self.pre_conv.conv.weight.dtype != torch.float32:
            snake_variant = None
        for module in self.modules():
            if isinstance(module, CausalTransposedConv):
                module.pack()
            elif isinstance(module, SnakeBeta):
                module.kernel_variant = snake_variant
        return self

    def new_state(self) -> DecodeState:
        return DecodeState(self.config)

    @torch.inference_mode()
    def forward(self, codes: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        """codes [T, Q] (LongTensor) -> PCM [T * samples_per_frame] in [-1, 1].

        With a ``state`` the frames continue the stream the state has seen.
        """
        if codes.ndim != 2 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"codes must be [frames, {self.config.num_quantizers}], got {tuple(codes.shape)}")
        weight = self.pre_conv.conv.weight
        hidden = self.quantizer(codes.t().to(weight.device)).to(weight.dtype)
        hidden = self.pre_conv(hidden, state)
        hidden = self.pre_transformer(hidden[0].t(), state).t()[None]
        for stage in self.upsample:
            for layer in stage:
                hidden = layer(hidden, state)
        for layer in self.decoder:
            hidden = layer(hidden, state)
        return hidden[0, 0].clamp(-1.0, 1.0)


def load_code2wav(model_dir: str | Path, config: Code2WavConfig, dtype: torch.dtype = torch.float32,
                  snake_variant: str | None = None) -> Code2Wav:
    """Code2Wav from the checkpoint's ``speech_tokenizer/`` (its ``decoder.*`` tensors), packed (``Code2Wav.pack``)."""
    return load_module(lambda: Code2Wav(config), Path(model_dir) / SPEECH_TOKENIZER_DIR, dtype,
                       prefix="decoder.", ignore=NOT_FOR_DECODING).pack(snake_variant)


def receptive_field_frames(config: Code2WavConfig) -> int:
    """Frames of left context after which a frame's audio no longer depends on earlier frames.

    An upper bound: the transformer's windows dominate (layers x (window - 1)),
    plus the convolutions' reach expressed in frames. A transposed conv is
    counted as two input steps (its output mixes the current and previous input).
    """
    frames = 2.0  # pre_conv, k=3
    frames += config.transformer.num_layers * (config.sliding_window - 1)
    steps_per_frame = 1
    for ratio in config.upsampling_ratios:
        frames += 2 / steps_per_frame
        steps_per_frame *= ratio
        frames += (CONVNEXT_KERNEL - 1) / steps_per_frame
    frames += 6 / steps_per_frame  # decoder's first conv, k=7
    for rate in config.upsample_rates:
        frames += 2 / steps_per_frame
        steps_per_frame *= rate
        frames += sum(6 * d for d in RESIDUAL_DILATIONS) / steps_per_frame
    frames += 6 / steps_per_frame  # final conv, k=7
    return math.ceil(frames)


class StreamingDecoder:
    """Decode frames as they arrive: each chunk is decoded after up to ``left_context`` earlier frames.

    With ``left_context >= receptive_field_frames(config)`` the concatenated
    chunks equal the whole-utterance decode (up to fp32 rounding); with less
    (the reference uses 25 frames) the joins are close but not exact.
    """

    def __init__(self, code2wav: Code2Wav, left_context: int) -> None:
        if left_context < 0:
            raise ValueError(f"left_context must be >= 0, got {left_context}")
        self.code2wav = code2wav
        self.left_context = left_context
        self.history = torch.empty(0, code2wav.config.num_quantizers, dtype=torch.long)

    def push(self, codes: torch.Tensor) -> torch.Tensor:
        """PCM for exactly these frames ([n, Q] -> [n * samples_per_frame])."""
        if codes.shape[0] == 0:
            return torch.empty(0)
        context = self.history[-self.left_context:] if self.left_context else self.history[:0]
        wav = self.code2wav(torch.cat((context, codes.cpu())))
        self.history = torch.cat((context, codes.cpu()))
        return wav[context.shape[0] * self.code2wav.config.samples_per_frame:]
