"""Loading safetensors weights into modules built on the meta device.

The modules are created without storage (``torch.device("meta")``) and each
parameter is then taken from the checkpoint, tensor by tensor, through
``safe_open`` (the file is memory-mapped; only the tensors the module asks
for are read). Sharded checkpoints (``model.safetensors.index.json``) work.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, TypeVar

import torch
from safetensors import safe_open
from torch import nn

M = TypeVar("M", bound=nn.Module)


class WeightsError(ValueError):
    """The checkpoint's tensors do not fit the model; the message lists the names."""


def safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    raise WeightsError(f"{directory} has no model.safetensors (nor model.safetensors.index.json)")


def build_and_load(factory: Callable[[], M], directory: str | Path, *, prefix: str = "",
                   ignore: tuple[str, ...] = (), dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu") -> M:
    """Build a module with ``factory`` and fill it from ``directory``'s safetensors.

    ``prefix`` is stripped from checkpoint names; names starting with one of
    ``ignore`` are parts of the checkpoint this model does not use. Any other
    extra or missing name is an error.
    """
    directory = Path(directory)
    with torch.device("meta"):
        module = factory()
    wanted = dict(module.named_parameters())
    state: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for path in safetensors_files(directory):
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                local = name[len(prefix):] if name.startswith(prefix) else None
                if local in wanted:
                    state[local] = handle.get_tensor(name).to(device=device, dtype=dtype)
                elif not name.startswith(ignore):
                    unexpected.append(name)
    missing = sorted(set(wanted) - set(state))
    if missing or unexpected:
        raise WeightsError(
            f"{directory}: the weights do not match the config "
            f"(missing: {missing[:8]}{' ...' if len(missing) > 8 else ''}; "
            f"unexpected: {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''})"
        )
    for local, tensor in state.items():
        if tensor.shape != wanted[local].shape:
            raise WeightsError(
                f"{directory}: {prefix}{local} has shape {tuple(tensor.shape)}, the config implies {tuple(wanted[local].shape)}"
            )
    module.load_state_dict(state, strict=True, assign=True)
    return module.eval().requires_grad_(False)
