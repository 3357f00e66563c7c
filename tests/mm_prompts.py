"""Multimodal prompts for tests: token ids with expanded placeholders and where each media item sits.

The tiny thinker checkpoints of the tests use these ids (their vocabularies are 300 tokens); the
prompts are laid out as transformers' Qwen2.5-VL and Qwen2.5-Omni processors lay them out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edge_infer.models.config import MultimodalConfig
from edge_infer.models.encoder_config import AudioConfig, VisionConfig
from edge_infer.models.mrope import MediaLayout, audio_in_video_pieces

AUDIO, IMAGE, VIDEO = 289, 290, 291
VISION_START, VISION_END, AUDIO_START, AUDIO_END = 292, 293, 294, 295
TOKEN_IDS = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START,
                 vision_end_token_id=VISION_END)
OMNI_TOKEN_IDS = dict(TOKEN_IDS, audio_token_id=AUDIO, audio_start_token_id=AUDIO_START, audio_end_token_id=AUDIO_END)


def mm_config(family: str, merge: int = 2, position_id_per_seconds: float | None = None) -> MultimodalConfig:
    omni = family == "qwen2_5_omni"
    ids = OMNI_TOKEN_IDS if omni else dict(TOKEN_IDS, audio_token_id=None, audio_start_token_id=None,
                                            audio_end_token_id=None)
    pps = position_id_per_seconds if position_id_per_seconds is not None else (25 if omni else 2)
    # the towers' shapes do not matter to prompts: only the merge size
    vision = VisionConfig(depth=1, hidden_size=16, num_heads=1, intermediate_size=16, out_hidden_size=16,
                          spatial_merge_size=merge, split_qkv=omni)
    audio = AudioConfig(num_mel_bins=16, d_model=16, encoder_layers=1, encoder_attention_heads=1, encoder_ffn_dim=16,
                        output_dim=16) if omni else None
    return MultimodalConfig(family=family, position_id_per_seconds=pps, seconds_per_chunk=2, vision=vision,
                            audio=audio, **ids)


def audio_tokens(frames: int) -> int:
    """The Omni audio tower's output length for ``frames`` mel frames."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


@dataclass
class Item:
    kind: str
    positions: np.ndarray
    grid_thw: tuple[int, int, int] | None = None
    second_per_grid: float | None = None
    frames: int | None = None  # audio: mel frames

    @property
    def layout(self) -> MediaLayout:
        return MediaLayout(self.kind, self.positions, self.grid_thw, self.second_per_grid)


@dataclass
class Prompt:
    mm: MultimodalConfig
    ids: list[int] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)

    def text(self, tokens) -> "Prompt":
        self.ids += list(tokens)
        return self

    def _run(self, kind: str, count: int, **kw) -> Item:
        item = Item(kind, np.arange(len(self.ids), len(self.ids) + count, dtype=np.int64), **kw)
        self.ids += [self.mm.placeholder_id(kind)] * count
        self.items.append(item)
        return item

    def image(self, grid: tuple[int, int, int]) -> "Prompt":
        self.ids.append(VISION_START)
        self._run("image", _tokens(grid, self.mm), grid_thw=grid)
        self.ids.append(VISION_END)
        return self

    def video(self, grid: tuple[int, int, int], second_per_grid: float) -> "Prompt":
        self.ids.append(VISION_START)
        self._run("video", _tokens(grid, self.mm), grid_thw=grid, second_per_grid=second_per_grid)
        self.ids.append(VISION_END)
        return self

    def audio(self, frames: int) -> "Prompt":
        self.ids.append(AUDIO_START)
        self._run("audio", audio_tokens(frames), frames=frames)
        self.ids.append(AUDIO_END)
        return self

    def video_with_audio(self, grid: tuple[int, int, int], second_per_grid: float, frames: int) -> "Prompt":
        """A video interleaved with its audio track, chunk by chunk (Omni's use_audio_in_video)."""
        self.ids += [VISION_START, AUDIO_START]
        video = Item("video", np.empty(0, dtype=np.int64), grid, second_per_grid)
        audio = Item("audio", np.empty(0, dtype=np.int64), frames=frames)
        for kind, first, end in audio_in_video_pieces(video.layout, audio_tokens(frames), self.mm):
            target = video if kind == "video" else audio
            target.positions = np.concatenate([target.positions, np.arange(len(self.ids), len(self.ids) + end - first)])
            self.ids += [self.mm.placeholder_id(kind)] * (end - first)
        self.items += [video, audio]
        self.ids += [AUDIO_END, VISION_END]
        return self

    @property
    def layouts(self) -> list[MediaLayout]:
        return [item.layout for item in self.items]


def _tokens(grid: tuple[int, int, int], mm: MultimodalConfig) -> int:
    return grid[0] * grid[1] * grid[2] // mm.spatial_merge_size**2


def random_prompt(rng: np.random.Generator, mm: MultimodalConfig, audio_in_video: bool = False,
                  max_items: int = 4, kinds: tuple[str, ...] | None = None) -> Prompt:
    """Text runs and media in random order and shapes; with ``audio_in_video`` (Omni), every video carries its
    audio interleaved (transformers takes that choice per prompt)."""
    kinds = kinds or mm.kinds
    prompt = Prompt(mm)
    merge = mm.spatial_merge_size

    def text() -> None:
        prompt.text(rng.integers(3, 280, size=int(rng.integers(0, 6))).tolist())

    def grid(t_max: int) -> tuple[int, int, int]:
        return (int(rng.integers(1, t_max + 1)), merge * int(rng.integers(1, 6)), merge * int(rng.integers(1, 6)))

    text()
    for _ in range(int(rng.integers(1, max_items + 1))):
        kind = kinds[int(rng.integers(len(kinds)))]
        spg = float(rng.choice([0.04, 1 / 3, 0.5, 2 / 3, 1.0, 1.5, 2.0, 2.7, 3.0]))
        if kind == "image":
            prompt.image((1, *grid(1)[1:]))
        elif kind == "video" and audio_in_video:
            prompt.video_with_audio(grid(8), spg, int(rng.integers(3, 1200)))
        elif kind == "video":
            prompt.video(grid(6), spg)
        else:
            prompt.audio(int(rng.integers(3, 400)))
        text()
    return prompt
