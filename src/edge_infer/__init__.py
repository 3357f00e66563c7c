"""edge-infer: text, speech and omni inference on edge machines.

Public names are resolved lazily so that ``import edge_infer`` stays cheap:
torch and friends are imported only by the modules that need them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "edge_infer.engine.llm",
    "SamplingParams": "edge_infer.engine.sampling_params",
    "StructuredOutputsParams": "edge_infer.engine.sampling_params",
    "RequestOutput": "edge_infer.engine.outputs",
    "CompletionOutput": "edge_infer.engine.outputs",
    "LocalTextEngine": "edge_infer.engine.local",
    "plan_text_session": "edge_infer.memory.plan",
    "Omni": "edge_infer.runtime.omni",
    "AsyncOmni": "edge_infer.runtime.omni",
}

__all__ = sorted(_LAZY) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.engine.llm import LLM
    from edge_infer.engine.local import LocalTextEngine
    from edge_infer.engine.outputs import CompletionOutput, RequestOutput
    from edge_infer.engine.sampling_params import SamplingParams, StructuredOutputsParams
    from edge_infer.memory.plan import plan_text_session
    from edge_infer.runtime.omni import AsyncOmni, Omni


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edge_infer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
