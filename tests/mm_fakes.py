"""Stand-in media encoders for tests of the engine's media plumbing: fixed random projections of the features.

Installed at edge-infer's encoder seam (``MultimodalLM.encoders``) in place of the real towers: cheap, countable
(``calls``), replaceable by a failing or thread-recording one; different inputs give different embeddings. Parity
of the real towers, whole models included, is tests/models/test_thinker_parity.py's.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from edge_infer.engine.protocol import MediaInput
from edge_infer.media.features import AudioFeatures, VisionFeatures

PATCH_DIM = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch


class FakeTowers:
    def __init__(self, hidden: int, merge: int = 2, mel_bins: int = 16, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.vision_w = torch.randn(merge * merge * PATCH_DIM, hidden, generator=g) * 0.3 / (merge * merge * PATCH_DIM) ** 0.5
        self.audio_w = torch.randn(mel_bins, hidden, generator=g) * 0.3 / mel_bins**0.5
        self.calls = 0  # encoder calls

    # the rows one image / video / clip gives
    def vision(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return pixel_values.float().reshape(-1, self.vision_w.shape[0]) @ self.vision_w

    def audio(self, mel: torch.Tensor) -> torch.Tensor:
        frames = mel.shape[1]
        tokens = ((frames - 1) // 2 + 1 - 2) // 2 + 1
        return mel.float().t()[:tokens] @ self.audio_w

    def encoders(self) -> dict:
        """edge-infer's seam: kind -> features -> embeddings (counting calls)."""
        def vision(f: VisionFeatures) -> torch.Tensor:
            self.calls += 1
            return self.vision(torch.from_numpy(f.pixel_values))

        def audio(f: AudioFeatures) -> torch.Tensor:
            self.calls += 1
            return self.audio(torch.from_numpy(f.mel))

        return {"image": vision, "video": vision, "audio": audio}


def vision_features(rng: np.random.Generator, grid: tuple[int, int, int], second_per_grid: float | None = None,
                    merge: int = 2) -> VisionFeatures:
    pixels = rng.standard_normal((grid[0] * grid[1] * grid[2], PATCH_DIM)).astype(np.float32)
    return VisionFeatures(pixels, tuple(grid), merge, second_per_grid)


def audio_features(rng: np.random.Generator, frames: int, mel_bins: int = 16) -> AudioFeatures:
    return AudioFeatures(rng.standard_normal((mel_bins, frames)).astype(np.float32))


def media_inputs(prompt, seed: int = 0) -> list[MediaInput]:
    """Random features for each media item of an ``mm_prompts.Prompt``, digested by their bytes."""
    rng = np.random.default_rng(seed)
    out = []
    for item in prompt.items:
        if item.kind == "audio":
            features = audio_features(rng, item.frames)
        else:
            features = vision_features(rng, item.grid_thw, item.second_per_grid, prompt.mm.spatial_merge_size)
        data = features.mel if item.kind == "audio" else features.pixel_values
        out.append(MediaInput(item.kind, features, item.positions, hashlib.sha256(data.tobytes()).digest()))
    return out
