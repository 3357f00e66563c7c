"""The media side of a multimodal thinker's plan: limits per request resolved, items sized, refusals (torch-free).

``plan_media`` takes the towers' configs (``ModelConfig.multimodal``) and reads
the checkpoint's preprocessing (preprocessor_config.json), resolves the
per-request limits (the caller's, else the checkpoint's defaults fitted to the
context), and sizes what the media cost: the towers' weights (dense, or as
``--encoder-quantization``'s kernel holds them) and their load transient, one
encode's activation peak at the largest item, what every running sequence
holds of its media (inputs until encoded, then embeddings), and the
frontend's preprocessing buffers. A text-only model has no media plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from edge_infer.config import QuantConfig
from edge_infer.errors import InvalidRequestError
from edge_infer.hardware.cpu import CpuCapabilities
from edge_infer.media.config import AudioProcessing, MediaProcessing, VisionProcessing
from edge_infer.media.limits import COUNT_LIMITS, LIMITS, MEDIA_PREP_THREADS, MediaLimits
from edge_infer.memory.encoder_sizing import (
    encoder_activation_bytes, held_media_bytes, native_elementwise, preprocessing_bytes, tower_load_transient_bytes,
    tower_weight_bytes,
)
from edge_infer.memory.media_shapes import MediaShapes, fit_limits, media_shapes
from edge_infer.memory.plan import PlanItem
from edge_infer.memory.sizing import CHECKPOINT_DTYPE_BYTES, MiB
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_config import AudioConfig, VisionConfig
from edge_infer.models.tokenizer import template_media_kinds
from edge_infer.quant.native_build import missing_toolchain

# The per-request limits whose defaults fit_limits may lower (the others are counts and durations).
SIZE_LIMITS = frozenset({"max_image_tokens", "max_video_frames", "max_audio_seconds"})


@dataclass
class MediaPlan:
    limits: MediaLimits
    shapes: MediaShapes
    items: list[PlanItem]
    kinds: tuple[str, ...]  # the media kinds the checkpoint takes: its family's, less those its chat template refuses
    notes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    levers: list[str] = field(default_factory=list)
    load_transient: int = 0  # the loader's peak beyond the weights while it fills the towers

    def settings(self) -> dict[str, Any]:
        return {f.name: getattr(self.limits, f.name) for f in fields(self.limits)}

    def sized_for(self) -> str:
        """The largest request the media items are sized for, in words."""
        s = self.shapes
        parts = []
        if s.image_grid:
            parts.append(f"{s.images} image(s) of up to {s.image_tokens} tokens (patch grid {_grid(s.image_grid)})")
        if s.video_grid:
            parts.append(f"{s.videos} video(s) of {s.video_frames} frames, up to {s.video_tokens} tokens (patch grid "
                         f"{_grid(s.video_grid)})" + (" and a sound track" if s.audio_frames else ""))
        if s.audio_frames:
            parts.append(f"{s.audios} clip(s) of {self.limits.max_audio_seconds:g} s ({s.audio_frames} mel frames, "
                         f"{s.audio_tokens} tokens)")
        return "; ".join(parts + [f"{s.request_tokens} prompt tokens in all"]) if parts else "no media"


def plan_media(model_dir: str | Path, cfg: ModelConfig, tensors: dict, dtype: str, max_model_len: int,
               max_num_seqs: int, limits: MediaLimits | Mapping[str, float] | None,
               encoder_quant: QuantConfig | None, cpu: CpuCapabilities) -> MediaPlan:
    """The media items of a thinker's plan (all allocated memory, held while serving).

    ``limits``: a ``MediaLimits`` is taken as given (every limit explicit); a mapping overrides some of the
    checkpoint's defaults (``MediaLimits.for_processing``) and the others are fitted to ``max_model_len``;
    None fits them all. ``encoder_quant``: the towers' linears' kernel (None: dense in ``dtype``). ``cpu``: the CPU
    planned for (its kernels set the encoders' activation calibration).
    """
    vision, audio = cfg.multimodal.vision, cfg.multimodal.audio
    media, notes = _processing(Path(model_dir), vision, audio)
    asked, explicit = _asked_limits(limits, media)
    kinds = template_media_kinds(model_dir, cfg.multimodal.kinds)
    asked, off_notes = _kinds_off(asked, [k for k in cfg.multimodal.kinds if k not in kinds])
    budget = max_model_len - 1  # a request at the limits leaves one token to generate
    fitted, fit_notes = fit_limits(asked, media, budget, explicit & SIZE_LIMITS)
    shapes = media_shapes(fitted, media)
    plan = MediaPlan(fitted, shapes, [], kinds, notes + off_notes + fit_notes, _check_processing(media, vision))
    if shapes.request_tokens > budget:
        plan.reasons.append(_too_many_tokens(shapes, fitted, max_model_len))
        plan.levers += _token_levers(asked, media, budget, cfg.max_position_embeddings, explicit & SIZE_LIMITS)
    d = 2 if dtype == "bfloat16" else 4
    src_bytes = max((CHECKPOINT_DTYPE_BYTES.get(t.dtype, 4) for t in tensors.values()), default=4)
    how = f"{encoder_quant.name} g{encoder_quant.group_size} linears, {dtype} rest" if encoder_quant else f"{dtype}, dense"
    for name, tower in (("vision", vision), ("audio", audio)):
        if tower is not None:
            plan.items.append(_item(f"{name} encoder weights", tower_weight_bytes(tower, d, encoder_quant),
                                    f"{how} (loaded with the decoder)"))
            plan.load_transient = max(plan.load_transient,
                                      tower_load_transient_bytes(tower, d, encoder_quant, src_bytes))
    held = held_media_bytes(shapes, vision, audio, cfg.hidden_size, d)
    preparing = preprocessing_bytes(shapes, vision, audio, media, fitted.max_image_pixels, MEDIA_PREP_THREADS)
    activations = _activation_item(shapes, vision, audio, d, cpu, dense=encoder_quant is None)
    plan.items += [
        activations,
        _block_cache_item(activations.bytes),
        _item("sequence media", max_num_seqs * held,
              f"{held / MiB:,.1f} MiB per sequence at the limits x {max_num_seqs}: each item's fp32 input until it "
              f"is encoded, then its {dtype} embeddings until the sequence finishes (the larger, per item); requests "
              f"beyond {max_num_seqs} sequences wait before their media are decoded"),
        _item("media preprocessing", preparing,
              f"the frontend preparing {MEDIA_PREP_THREADS} requests at the limits at once: their features, one's "
              "pickled copies for the worker, the decode and patch buffers of their largest items"),
    ]
    return plan


def _asked_limits(limits: MediaLimits | Mapping[str, float] | None,
                  media: MediaProcessing) -> tuple[MediaLimits, frozenset[str]]:
    """The limits asked for, over the checkpoint's defaults, and the names the caller set."""
    if isinstance(limits, MediaLimits):
        return limits, frozenset(f.name for f in fields(MediaLimits))
    try:
        return MediaLimits.for_processing(media, **dict(limits or {})), frozenset((limits or {}).keys())
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"media limits: {exc}; known limits: {', '.join(LIMITS)}") from exc


def _kinds_off(limits: MediaLimits, refused: list[str]) -> tuple[MediaLimits, list[str]]:
    """``limits`` with no room for the kinds the chat template refuses: nothing is planned for what no
    request can carry."""
    off = {COUNT_LIMITS[k]: 0 for k in refused if getattr(limits, COUNT_LIMITS[k])}
    notes = [f"the chat template renders no {k} parts: {COUNT_LIMITS[k]} 0, nothing planned for them"
             for k in refused if COUNT_LIMITS[k] in off]
    return replace(limits, **off), notes


def _item(name: str, size: int, note: str) -> PlanItem:
    return PlanItem(name, size, "anon", "steady", note)


def _grid(grid: tuple[int, int, int]) -> str:
    return "x".join(map(str, grid))


def _processing(model_dir: Path, vision: VisionConfig | None,
                audio: AudioConfig | None) -> tuple[MediaProcessing, list[str]]:
    """The checkpoint's preprocessing for the towers it has; transformers' defaults where it ships none."""
    found = MediaProcessing.from_dir(model_dir)
    notes = []
    parts = {}
    for name, cfg, default, key in (("vision", vision, VisionProcessing(), "max_pixels"),
                                    ("audio", audio, AudioProcessing(), "chunk_length")):
        part = getattr(found, name)
        if cfg is not None and part is None:
            part = default
            notes.append(f"no {name} preprocessing in preprocessor_config.json: planned with transformers' "
                         f"defaults ({key} {getattr(default, key)})")
        parts[name] = part if cfg is not None else None
    return MediaProcessing(**parts), notes


def _check_processing(media: MediaProcessing, vision: VisionConfig | None) -> list[str]:
    """The processor must cut patches the tower takes."""
    if vision is None or media.vision is None:
        return []
    pairs = (("patch_size", media.vision.patch_size, vision.patch_size),
             ("temporal_patch_size", media.vision.temporal_patch_size, vision.temporal_patch_size),
             ("merge_size", media.vision.merge_size, vision.spatial_merge_size))
    return [f"preprocessor_config.json's {name}={ours} differs from vision_config's {theirs}: the processor's patches "
            "would not fit the vision tower; restore the checkpoint's preprocessor_config.json"
            for name, ours, theirs in pairs if ours != theirs]


def _activation_item(shapes: MediaShapes, vision: VisionConfig | None, audio: AudioConfig | None,
                     dtype_bytes: int, cpu: CpuCapabilities, dense: bool) -> PlanItem:
    """One encode at a time: the larger of the vision tower's largest call and the audio tower's longest clip."""
    parts = []
    if vision is not None and shapes.largest_vision_patches:
        grid = max((g for g in (shapes.image_grid, shapes.video_grid) if g), key=lambda g: g[0] * g[1] * g[2])
        what = "image" if grid == shapes.image_grid else "video"
        native = native_elementwise(dtype_bytes, cpu)
        parts.append((encoder_activation_bytes(vision, shapes.largest_vision_patches, dtype_bytes, native, cpu, dense),
                      f"the largest {what} (patch grid {_grid(grid)})"))
    if audio is not None and shapes.audio_frames:
        parts.append((encoder_activation_bytes(audio, shapes.audio_frames, dtype_bytes, cpu=cpu, dense=dense),
                      f"the longest clip ({shapes.audio_frames} mel frames)"))
    if not parts:
        return _item("encoder activations", 0, "no media allowed by the limits")
    size, what = max(parts)
    others = "".join(f"; {w}: {b / MiB:,.1f} MiB" for b, w in parts if w != what)
    return _item("encoder activations", size, f"one encode at a time, sized for {what}{others}")


def _block_cache_item(encode_bytes: int) -> PlanItem:
    """Freed blocks the worker keeps for the next tensors of their sizes: as many bytes as one encode's live
    tensors (quant/csrc/block_cache.cpp; none where edge-infer's native library cannot be built)."""
    missing = missing_toolchain()
    if missing is not None:
        return _item("block cache", 0, f"none: every large block is mapped on its own ({missing})")
    return _item("block cache", encode_bytes, "freed tensor blocks kept for reuse by size, up to one encode's "
                 "activations, so that encodes and steps do not fault their memory in afresh; given back after "
                 "each encode and when idle")


def _too_many_tokens(shapes: MediaShapes, limits: MediaLimits, max_model_len: int) -> str:
    kinds = shapes.kind_tokens()
    parts = []
    if kinds["images"]:
        parts.append(f"{limits.max_images} image(s) of up to {shapes.image_tokens} tokens "
                     f"(--max-image-tokens {limits.max_image_tokens})")
    if kinds["videos"]:
        track = f" and a sound track of up to {shapes.audio_tokens}" if shapes.audio_frames else ""
        parts.append(f"{limits.max_videos} video(s) of up to {shapes.video_tokens} tokens{track} "
                     f"(--max-video-frames {limits.max_video_frames})")
    if kinds["audio"]:
        parts.append(f"{limits.max_audios} clip(s) of up to {shapes.audio_tokens} tokens "
                     f"(--max-audio-seconds {limits.max_audio_seconds:g})")
    return (f"the media limits let one request carry {shapes.request_tokens} media tokens ({'; '.join(parts)}, "
            f"with their markers), more than max_model_len={max_model_len} holds with a token to generate")


def _token_levers(limits: MediaLimits, media: MediaProcessing, budget: int, model_max: int,
                  explicit: frozenset[str]) -> list[str]:
    """What would make a request at ``limits`` (as asked, before fitting) fit: the size limits the caller set,
    at the values the defaults would give them (every kind an equal share of the context); one of them
    alone; a lower count; a longer context."""
    levers = []
    shared, _ = fit_limits(limits, media, budget, frozenset())
    changed = [name for name in sorted(explicit) if getattr(shared, name) != getattr(limits, name)]
    if changed and media_shapes(shared, media).request_tokens <= budget:
        levers.append(" ".join(_setting(name, getattr(shared, name)) for name in changed)
                      + " (every kind of media an equal share of the context)")
    for name in sorted(explicit):
        alone, _ = fit_limits(limits, media, budget, SIZE_LIMITS - {name})
        value = getattr(alone, name)
        if value and value != getattr(limits, name) and media_shapes(alone, media).request_tokens <= budget:
            levers.append(_setting(name, value))
    for name in ("max_images", "max_videos", "max_audios"):
        for count in range(getattr(limits, name) - 1, 0, -1):
            if media_shapes(replace(limits, **{name: count}), media).request_tokens <= budget:
                levers.append(f"{LIMITS[name].flag} {count}")
                break
    needed = media_shapes(limits, media).request_tokens + 1
    if needed <= model_max:
        levers.append(f"--max-model-len {needed} (holds a request at these limits)")
    return list(dict.fromkeys(levers))


def _setting(name: str, value: float) -> str:
    off = {"max_image_tokens": " (no images or videos)", "max_video_frames": " (no videos)",
           "max_audio_seconds": " (no audio)"}[name] if not value else ""
    return f"{LIMITS[name].flag} {value:g}{off}"
