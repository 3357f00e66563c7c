"""What crosses the worker pipe for one media item: plain numpy, picklable."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class VisionFeatures:
    """One image, or one video."""

    pixel_values: np.ndarray  # float32 [grid_t * grid_h * grid_w, 3 * temporal_patch * patch * patch], processor order
    grid_thw: tuple[int, int, int]
    merge_size: int
    second_per_grid: float | None = None  # videos: temporal_patch_size / fps

    @property
    def num_tokens(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w // self.merge_size**2


@dataclass
class AudioFeatures:
    mel: np.ndarray  # float32 [feature_size, frames], frames = the unpadded length

    @property
    def num_tokens(self) -> int:
        """The audio tower's output length for these frames (two stride-2 steps)."""
        frames = self.mel.shape[1]
        return ((frames - 1) // 2 + 1 - 2) // 2 + 1
