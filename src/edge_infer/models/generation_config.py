"""End-of-sequence ids and default sampling from ``generation_config.json``."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Keys of generation_config.json that become SamplingParams defaults.
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    sampling: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dir(cls, model_dir: str | Path, tokenizer_eos: int | None = None) -> "GenerationDefaults":
        path = Path(model_dir) / "generation_config.json"
        raw: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        eos = raw.get("eos_token_id")
        if eos is None:
            eos = [] if tokenizer_eos is None else [tokenizer_eos]
        elif isinstance(eos, int):
            eos = [eos]
        if tokenizer_eos is not None and tokenizer_eos not in eos:
            eos = [*eos, tokenizer_eos]
        sampling = {ours: raw[theirs] for theirs, ours in SAMPLING_KEYS.items() if raw.get(theirs) is not None}
        if raw.get("do_sample") is False:
            sampling = {"temperature": 0.0}
        return cls(eos_token_ids=tuple(int(e) for e in eos), sampling=sampling)
