"""What preprocessing hands to the encoders: plain numpy arrays, picklable across the worker pipe."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_infer.models.encoder_config import audio_output_length


@dataclass
class VisionFeatures:
    """One image or one video, cut into the vision encoder's patches.

    pixel_values: float32 [grid_t * grid_h * grid_w, 3 * temporal_patch * patch * patch], rows in the
    processor's order (merge windows of merge x merge patches together), each row channel-major.
    """

    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    merge_size: int
    second_per_grid: float | None = None  # videos: seconds one temporal patch spans (temporal_patch_size / fps)

    @property
    def num_tokens(self) -> int:
        """The placeholder tokens this input takes in the prompt (patches after the merger)."""
        t, h, w = self.grid_thw
        return t * h * w // self.merge_size**2


@dataclass
class AudioFeatures:
    """One audio clip's log-mel features: float32 [feature_size, frames], the frames the processor's mask keeps."""

    mel: np.ndarray

    @property
    def frames(self) -> int:
        return int(self.mel.shape[1])

    @property
    def num_tokens(self) -> int:
        """The placeholder tokens this clip takes in the prompt."""
        return audio_output_length(self.frames)

