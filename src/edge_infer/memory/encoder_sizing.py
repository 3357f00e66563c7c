"""Bytes of a multimodal thinker's media side, from the towers' configs and the largest media (torch-free).

- tower weights as resident for the encoders' weight kernel (``quant``: None
  for dense weights in the engine dtype), from ``models.encoder_weights``, and
  what loading them needs beyond that;
- one encode's activation peak: the tensors ``models/vision.py`` and
  ``models/audio_encoder.py`` hold at once in their largest phase (a block's
  rotary or MLP step, the audio front end's convolutions), by shape, times a
  factor and plus a fixed part measured per tower and dtype
  (``scripts/measure_overhead.py`` with ``memory.encoder_probe``);
- what a running sequence holds of its media: an item's encoder input (the
  worker's copy of its features) until the item is encoded, then its
  embeddings until the sequence finishes;
- the frontend's preprocessing buffers for the requests it prepares at once.
"""
from __future__ import annotations

from edge_infer.config import QuantConfig
from edge_infer.hardware.cpu import CpuCapabilities, detect
from edge_infer.hardware.kernels import KERNELS
from edge_infer.media.audio import DECODE_BLOCK_SAMPLES
from edge_infer.media.config import MediaProcessing
from edge_infer.media.image import IMAGE_DECODE_BYTES
from edge_infer.memory.media_shapes import MediaShapes
from edge_infer.memory.sizing import LOAD_BLOCK_BYTES, runtime_overhead
from edge_infer.models.encoder_config import AudioConfig, VisionConfig, conv_output_length
from edge_infer.models.encoder_weights import audio_weight_specs, vision_weight_specs

FP32 = 4
INT64 = 8
CONV_KERNEL = 3  # the audio tower's two Conv1d


def tower_weight_bytes(cfg: VisionConfig | AudioConfig, dtype_bytes: int, quant: QuantConfig | None) -> int:
    """Resident bytes of one tower: every tensor in the engine dtype, or its linears packed for ``quant``."""
    specs = vision_weight_specs(cfg) if isinstance(cfg, VisionConfig) else audio_weight_specs(cfg)
    if quant is None:
        return sum(s.numel for s in specs) * dtype_bytes
    from edge_infer.quant.sizes import spec_nbytes

    return sum(spec_nbytes(s, quant, dtype_bytes, tied=False) for s in specs)


def tower_load_transient_bytes(cfg: VisionConfig | AudioConfig, dtype_bytes: int, quant: QuantConfig | None,
                               src_bytes: int) -> int:
    """The loader's peak beyond the tower's weights: dense, one block being converted plus the largest linear held
    twice while it is repacked (``memory.sizing.load_transient_bytes``); quantized, one block of rows."""
    specs = vision_weight_specs(cfg) if isinstance(cfg, VisionConfig) else audio_weight_specs(cfg)
    if quant is None:
        largest = largest_linear_bytes(cfg, dtype_bytes)
        return min(LOAD_BLOCK_BYTES, largest * src_bytes // dtype_bytes) + largest
    from edge_infer.quant.sizes import repack_transient_bytes

    return repack_transient_bytes(specs, quant, False, src_bytes)


def native_elementwise(dtype_bytes: int, cpu: CpuCapabilities | None = None) -> bool:
    """Whether the encoders' elementwise steps run on edge-infer's native kernels on ``cpu`` (this one by default;
    ``quant.native.enable_native_ops``: bf16 activations, a CPU the int8 kernels' variants run on, the library
    buildable)."""
    from edge_infer.hardware.kernels import KERNELS
    from edge_infer.quant.native_build import missing_toolchain

    return dtype_bytes == 2 and KERNELS["cpu-w4a8"].missing(cpu or detect()) is None and missing_toolchain() is None


def products_bytes(dtype_bytes: int, cpu: CpuCapabilities | None = None) -> int:
    """The element size of the towers' front ends (the patch embedding, the audio convolutions) on ``cpu`` (this one):
    fp32 for bf16 towers where the CPU has no bf16 arithmetic (``models.layers.linear.products_dtype``)."""
    return FP32 if dtype_bytes == 2 and not (cpu or detect()).native_bf16 else dtype_bytes


def linear_accumulator_bytes(dtype_bytes: int, cpu: CpuCapabilities | None = None) -> int:
    """The element size of the fp32 copy of its output a dense linear (a tower's, the decoder's) holds while it runs
    on ``cpu`` (this one), or 0: oneDNN's bf16 linears emulated on AVX-512 without bf16 arithmetic accumulate the
    whole output in fp32 (one product's resident growth measured 3.0-3.2x its bf16 output on an Ice Lake Xeon,
    1,024-4,096 rows)."""
    return FP32 if calibration_class(dtype_bytes, cpu) == "bf16_emulated" else 0


def vision_tensor_bytes(cfg: VisionConfig, patches: int, d: int, native: bool = False, products: int | None = None,
                        accumulator: int = 0) -> int:
    """The bytes of the tensors one ViT call over ``patches`` patches holds at once, by shape.

    Per patch, in the largest of its phases (``x`` the residual a block starts from, held by the caller):
    the patch embedding (a copy of the fp32 pixels in the ``products`` element size, ``d`` by default, the
    product, and where that is not ``d`` the product rounded and a widened copy of the weight; then ``x``
    in window order); a norm (its output, plus two fp32 copies unless the ``native`` kernel normalises in
    one pass); a block's rotary step (``x``, the fused qkv, and q/k rotated: by the ``native`` kernel into
    a new tensor of the activations' dtype, or by PyTorch in fp32, the float copy rotated in place and the
    roll); its attention (q/k/v gathered where windows differ in size, the output); its MLP (``x``, qkv,
    the rotated q/k and the attention output are still referenced, the residual after attention, gate/up
    with the activation applied in place, and the product; while gate/up runs, its ``accumulator``: an
    element of that size per output, linear_accumulator_bytes); the merger. Throughout: the fp32 cos/sin
    and the int64 2-D positions of every patch.
    """
    h, i, o = cfg.hidden_size, cfg.intermediate_size, cfg.out_hidden_size
    p = products or d
    m2 = cfg.merge_unit
    pixels_copy = cfg.patch_dim * p if p != FP32 else 0
    embed = max(pixels_copy + h * p + (h * d if p != d else 0), 2 * h * d)
    widened_weight = h * cfg.patch_dim * p if p != d else 0
    norm = 2 * h * d + (0 if native else 2 * h * FP32)
    rotary = 6 * h * d if native else 4 * h * d + 2 * 2 * h * FP32
    attention = 11 * h * d
    mlp = max(8 * h * d + 3 * i * d, 8 * h * d + 2 * i * (d + accumulator))
    merger = max(norm, 3 * h * d, 2 * h * d + o * d // m2)
    throughout = 2 * cfg.head_dim * FP32 + 2 * INT64
    return max(patches * (throughout + embed) + widened_weight,
               patches * (throughout + max(norm, rotary, attention, mlp, merger)))


def audio_tensor_bytes(cfg: AudioConfig, frames: int, d: int, products: int | None = None, accumulator: int = 0) -> int:
    """The bytes of the tensors one audio-tower call over ``frames`` mel frames holds at once, by shape.

    The front end works on whole chunks of ``2 n_window`` frames (the last zero-padded), in the ``products``
    element size (``d`` by default): the padded mel, conv1's output and its GELU, then conv2's (half the
    frames) and its GELU; the convolutions reorder their weights into oneDNN's layout for each call (one
    transient copy, beside a widened copy where ``products`` is not ``d``); then, where it is not, the tokens
    with their positions added, laid out token-major and rounded to ``d``. A layer holds, per token: its
    input, the fused qkv, q and v with their biases, the attention output, the residual, the MLP's norm,
    and fc1's output and its GELU (while fc1 runs, its ``accumulator`` instead of the GELU's output).
    """
    dm, ffn, bins = cfg.d_model, cfg.encoder_ffn_dim, cfg.num_mel_bins
    p = products or d
    chunks = -(-frames // cfg.chunk_frames)
    padded = chunks * cfg.chunk_frames
    tokens_padded = chunks * cfg.chunk_tokens
    tokens = conv_output_length(frames)
    mel = bins * frames * p if p != FP32 else 0
    conv_weights = (dm * bins + dm * dm) * CONV_KERNEL * p * (1 if p == d else 2)
    rounded = bins * padded * p + 2 * dm * tokens_padded * p + tokens * dm * d if p != d else 0
    front = max(mel + bins * padded * p + 2 * dm * padded * p,
                bins * padded * p + dm * padded * p + 2 * dm * tokens_padded * p, rounded) + conv_weights
    layers = tokens * max((9 * dm + 2 * ffn) * d, (9 * dm + ffn) * d + ffn * accumulator)
    return max(front, layers)


def encoder_activation_bytes(cfg: VisionConfig | AudioConfig, size: int, dtype_bytes: int, native: bool = False,
                             cpu: CpuCapabilities | None = None, dense: bool = True) -> int:
    """One encode's RssAnon peak over the tower's weights and input: ``size`` patches (vision) or mel frames
    (audio), the elementwise steps on the ``native`` kernels or not (``native_elementwise``). The tensors by
    shape, times the measured factor, plus the measured fixed part: a base (oneDNN's primitives, thread
    scratch) and the BLAS's packing buffers, which grow with the largest weight matrix (fp32 products go
    through MKL's sgemm, which keeps a packed copy of a panel of the weight per call); calibrated for ``cpu``'s
    kernels (this CPU by default). ``dense``: the linears in the dtype (oneDNN's), not quantized ones, whose int8
    kernels hold no fp32 copy of an output (linear_accumulator_bytes)."""
    if not size:
        return 0
    factor, fixed, per_weight_byte = encoder_calibration(cfg, dtype_bytes, cpu)
    products = products_bytes(dtype_bytes, cpu)
    accumulator = linear_accumulator_bytes(dtype_bytes, cpu) if dense else 0
    if isinstance(cfg, VisionConfig):
        tensors = vision_tensor_bytes(cfg, size, dtype_bytes, native, products, accumulator)
    else:
        tensors = audio_tensor_bytes(cfg, size, dtype_bytes, products, accumulator)
    return int(factor * tensors + fixed + per_weight_byte * largest_linear_bytes(cfg, dtype_bytes))


def largest_linear_bytes(cfg: VisionConfig | AudioConfig, dtype_bytes: int) -> int:
    specs = vision_weight_specs(cfg) if isinstance(cfg, VisionConfig) else audio_weight_specs(cfg)
    return max(s.numel for s in specs if s.is_linear) * dtype_bytes


def calibration_class(dtype_bytes: int, cpu: CpuCapabilities | None = None) -> str:
    """Which measured calibration a tower's encode takes here: "fp32", or bf16 on oneDNN's AVX-512 kernels ("bf16"),
    on its AMX tile kernels ("bf16_amx") or on its AVX-512 kernels emulating bf16 where the CPU has no bf16
    arithmetic ("bf16_emulated": Skylake-X to Ice Lake and Tiger Lake). Each holds a different peak: one bf16
    calibration for all left the ViT's plan 11-13% over its measured peak on an AMD Zen 4, and 29% under it on an
    Ice Lake Xeon (emulated). Where oneDNN's bf16 does not run (AVX2), the towers' products run in PyTorch's own
    bf16 path, which the "bf16" keys hold within 10% (AMD Zen 3)."""
    if dtype_bytes != 2:
        return "fp32"
    cpu = cpu or detect()
    if cpu.has("amx_bf16"):
        return "bf16_amx"
    return "bf16_emulated" if not cpu.native_bf16 and KERNELS["onednn-bf16"].missing(cpu) is None else "bf16"


def calibration_prefix(tower: str, dtype_bytes: int, cpu: CpuCapabilities | None = None) -> str:
    """The overhead.json keys' prefix for one tower ("vision" or "audio") in one dtype, on ``cpu`` (this one)."""
    return f"encoder_{tower}_{calibration_class(dtype_bytes, cpu)}_"


def encoder_calibration(cfg: VisionConfig | AudioConfig, dtype_bytes: int,
                        cpu: CpuCapabilities | None = None) -> tuple[float, int, float]:
    """(factor, fixed bytes, bytes per byte of the largest linear) measured for this kind of tower in this dtype
    (memory/overhead.json, scripts/measure_overhead.py). Each tower has its own: their allocation patterns differ
    (the ViT's many per-block temporaries, the audio tower's few large ones), and one factor for both left the
    audio tower's bf16 plan 10% over its measured peak."""
    calib = runtime_overhead()
    prefix = calibration_prefix("vision" if isinstance(cfg, VisionConfig) else "audio", dtype_bytes, cpu)
    return (calib[prefix + "activation_factor"], int(calib[prefix + "activation_fixed_bytes"]),
            calib[prefix + "scratch_per_weight_byte"])


def vision_input_bytes(grid: tuple[int, int, int] | None, cfg: VisionConfig) -> int:
    """``pixel_values`` of one image or video: fp32 [patches, patch_dim]."""
    return grid[0] * grid[1] * grid[2] * cfg.patch_dim * FP32 if grid else 0


def audio_input_bytes(frames: int | None, cfg: AudioConfig) -> int:
    """The log-mel of one clip: fp32 [num_mel_bins, frames]."""
    return cfg.num_mel_bins * frames * FP32 if frames else 0


def request_input_bytes(shapes: MediaShapes, vision: VisionConfig | None, audio: AudioConfig | None) -> int:
    """The encoder inputs of one request at the limits (every image, video, clip and track)."""
    total = 0
    if vision is not None:
        total += shapes.images * vision_input_bytes(shapes.image_grid, vision)
        total += shapes.videos * vision_input_bytes(shapes.video_grid, vision)
    if audio is not None:
        track = audio_input_bytes(shapes.audio_frames, audio) if shapes.video_grid else 0
        total += shapes.audios * audio_input_bytes(shapes.audio_frames, audio) + shapes.videos * track
    return total


# The log-mel's working set beyond its float64 rows: one block of 1024 windowed frames and their spectra.
MEL_BLOCK_BYTES = 1024 * (400 * 8 * 2 + 201 * 16)


def held_media_bytes(shapes: MediaShapes, vision: VisionConfig | None, audio: AudioConfig | None, hidden: int,
                     dtype_bytes: int) -> int:
    """What one sequence at the limits holds of its media in the worker: each item's encoder input until it is
    encoded (the engine core drops it then), and its embeddings from then until the sequence finishes (so that a
    recompute after preemption does not encode again); the larger of the two per item, as a sequence whose
    prefill has reached some of its items and not the others holds both kinds."""
    def held(inputs: int, tokens: int) -> int:
        return max(inputs, embedding_bytes(tokens, hidden, dtype_bytes))

    total = 0
    if vision is not None and shapes.image_grid:
        total += shapes.images * held(vision_input_bytes(shapes.image_grid, vision), shapes.image_tokens)
    if vision is not None and shapes.video_grid:
        total += shapes.videos * held(vision_input_bytes(shapes.video_grid, vision), shapes.video_tokens)
    if audio is not None and shapes.audio_frames:
        clips = shapes.audios + (shapes.videos if shapes.video_grid else 0)  # a video's sound track is a clip too
        total += clips * held(audio_input_bytes(shapes.audio_frames, audio), shapes.audio_tokens)
    return total


def preprocessing_bytes(shapes: MediaShapes, vision: VisionConfig | None, audio: AudioConfig | None,
                        media: MediaProcessing, max_image_pixels: int, at_once: int = 1) -> int:
    """The frontend's peak while it prepares ``at_once`` requests at the limits and sends one (``media/``).

    Every item's features exist before the request is sent, and pickling them for the worker (protocol 4)
    holds two more copies of their bytes (numpy's ``tobytes`` and the pickle stream). Before that, the
    largest item's working buffers sit beside the features made so far: an image's decoded picture (at most
    ``max_image_pixels``) and its RGB copy (IMAGE_DECODE_BYTES), the resized frame and its array, the uint8 patches
    copied twice (frame pair, patch order) and the float32 patches; a video's decoded source frame, its
    resized frames, stacked, and the same patch copies; a clip's mono float32 samples at the model's rate
    (resampled a decoded block at a time, whatever the source rate, and concatenated), then the float64 clip
    and its reflected padding beside three float64 copies of the spectrogram rows (log, clamped, scaled).
    The other requests being prepared hold their features and buffers; a request's are released once it is
    sent (the frontends keep its token ids only).
    """
    features = request_input_bytes(shapes, vision, audio)
    buffers = 0
    if vision is not None and shapes.image_grid:
        patches = vision_input_bytes(shapes.image_grid, vision)
        buffers = max(buffers, IMAGE_DECODE_BYTES * max_image_pixels + 2 * patches // 8 + 2 * patches // FP32 + patches)
    if vision is not None and shapes.video_grid:
        patches = vision_input_bytes(shapes.video_grid, vision)
        buffers = max(buffers, IMAGE_DECODE_BYTES * max_image_pixels + 3 * patches // FP32 + patches)
    if audio is not None and shapes.audio_frames and media.audio is not None:
        samples = shapes.audio_frames * media.audio.hop_length
        rows = shapes.audio_frames * audio.num_mel_bins * 8
        decode = audio_decode_bytes(samples)
        mel = FP32 * samples + 2 * 8 * samples + 3 * rows + MEL_BLOCK_BYTES
        buffers = max(buffers, decode, mel)
    return max(features + buffers, 3 * features) + (at_once - 1) * (features + buffers)


def audio_decode_bytes(samples: int) -> int:
    """Decoding a clip of ``samples`` at the model's rate (media/audio.py, any source rate): the resampled pieces
    and their concatenation, beside one decoded block, soundfile's copy of it, its mono mix and finite-check mask."""
    return 2 * FP32 * samples + 4 * FP32 * DECODE_BLOCK_SAMPLES


def embedding_bytes(rows: int, hidden: int, dtype_bytes: int) -> int:
    return rows * hidden * dtype_bytes
