"""What a checkpoint directory holds, read from file headers only.

Torch-free: the planner uses it to size and validate a checkpoint without
loading a weight (``safetensors`` with the numpy framework reads headers).

Tensors are known by canonical names, whatever layout wrote them: the full
Qwen2.5-Omni model keeps its thinker under ``thinker.``, and Qwen2.5-VL
checkpoints saved by some transformers 4.x versions nest the text model
under ``model.language_model.`` and the towers under ``model.``; all of them
read as the thinker's hub layout (``model.layers.*``, ``lm_head``,
``visual.*``, ``audio_tower.*``). ``TensorInfo.key`` keeps the stored name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edge_infer.errors import CheckpointError
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_weights import TOWER_PREFIXES
from edge_infer.models.weights import WeightSpec


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    key: str  # the name in the file (the index is keyed by the canonical name)


# The nested layout of transformers 4.5x's Qwen2.5-VL saves: stored prefix -> canonical prefix.
_NESTED_PREFIXES = (
    ("model.language_model.", "model."),
    ("model.visual.", "visual."),
    ("model.audio_tower.", "audio_tower."),
)


def canonical_name(key: str) -> str:
    """The name a tensor is known by (see the module docstring)."""
    key = key.removeprefix("thinker.")
    for stored, canonical in _NESTED_PREFIXES:
        if key.startswith(stored):
            return canonical + key[len(stored):]
    return key


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index} is malformed ({exc}); it must hold a 'weight_map' object") from exc
        files = sorted({model_dir / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that are missing: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors weights in {model_dir}; edge-infer reads safetensors checkpoints only")
    return files


def read_tensor_index(model_dir: str | Path) -> dict[str, TensorInfo]:
    """Canonical name -> (file, dtype, shape, stored name) from the safetensors headers, without reading weights."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    index: dict[str, TensorInfo] = {}
    for path in safetensors_files(model_dir):
        try:
            with safe_open(str(path), framework="numpy") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    name = canonical_name(key)
                    if name in index:
                        raise CheckpointError(f"{model_dir} holds both {index[name].key!r} and {key!r}, two names "
                                              f"for one tensor ({name!r}); keep one layout")
                    index[name] = TensorInfo(path, sl.get_dtype(), tuple(sl.get_shape()), key)
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    return index


def check_checkpoint(cfg: ModelConfig, model_dir: str | Path, specs: list[WeightSpec]) -> dict[str, TensorInfo]:
    """Verify every tensor the model needs exists with the right shape, before loading."""
    index = read_tensor_index(model_dir)
    missing = [s for spec in specs for s in spec.sources if s not in index]
    for tower, prefix in TOWER_PREFIXES.items():
        if any(s.startswith(prefix) for s in missing) and not any(name.startswith(prefix) for name in index):
            raise CheckpointError(
                f"checkpoint {model_dir} has no {tower} tower: no tensor is named '{prefix}*' (nor "
                f"'thinker.{prefix}*' or 'model.{prefix}*'), but its config ({cfg.architecture}) has one; "
                "is it a text-only export of the model, or is the download incomplete?"
            )
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(
            f"checkpoint {model_dir} lacks {', '.join(missing[:3])}{more} needed by its config "
            f"({cfg.architecture}, {cfg.num_hidden_layers} layers); is the download complete?"
        )
    return index


ASSETS = Path(__file__).resolve().parent.parent / "assets"


def demo_model_dir() -> Path:
    """The embedded text demo model (src/edge_infer/assets/demo-model, trained by scripts/train_demo.py)."""
    return ASSETS / "demo-model"


def vision_demo_model_dir() -> Path:
    """The embedded vision demo (src/edge_infer/assets/demo-vl-model, trained by scripts/train_demo_vision.py): the
    text demo with a vision tower. The model a command uses when none is named."""
    return ASSETS / "demo-vl-model"
