"""The stage executor protocol and the executor registry.

A stage process runs one executor. The worker drives it with:

    start(stage)                      once, in the stage process
    submit(request_id, params)        a request opens at this stage
    feed(request_id, payload)         one input chunk (from the prompt or an upstream stage)
    end_input(request_id)             every upstream stage finished this request
    step() -> [StepOutput]            do one unit of work; called while has_work()
    abort(request_id)                 forget the request now
    shutdown()

Each executor declares, as class attributes, the stage kinds and devices it
serves and the contracts it accepts and emits: a deploy config is checked
against these at load, before any process starts. ``plan`` gives its memory
reservation from the stage settings ("auto" in the deploy config).

Executors are registered by name with an import target ``module:Class``;
worker processes import the target, so a class registered at run time must
live at module level in an importable module.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pydantic import BaseModel, ConfigDict

from edge_infer.runtime.contracts import Payload

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.runtime.config import StageConfig


@dataclass
class StepOutput:
    """One result of ``step``: a chunk for a request, its end, or its failure."""

    request_id: str
    payload: Payload | None
    finished: bool = False
    error: str | None = None


@dataclass(frozen=True)
class ReservationPlan:
    """Bytes a stage holds while it runs, as its executor plans them."""

    weights_bytes: int = 0
    kv_bytes: int = 0
    buffers_bytes: int = 0  # activations and working buffers
    runtime_bytes: int = 0  # the stage process itself: interpreter, libraries, allocator arenas
    max_payload_bytes: int = 0  # the largest payload the stage emits


@dataclass
class FrameQueue:
    """Rows (frames or tokens) a request has fed a stage and the stage has not consumed yet."""

    pending: list[np.ndarray] = field(default_factory=list)
    count: int = 0
    ended: bool = False  # every upstream stage finished this request

    def put(self, rows: np.ndarray) -> None:
        self.pending.append(rows)
        self.count += len(rows)

    def take(self, n: int) -> np.ndarray:
        rows = np.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        chunk, rest = rows[:n], rows[n:]
        self.pending = [rest] if len(rest) else []
        self.count = len(rest)
        return chunk


class StageRequestError(Exception):
    """A failure that concerns one request only; the stage keeps serving others."""

    def __init__(self, request_id: str, message: str):
        super().__init__(message)
        self.request_id = request_id


class ExecutorOptions(BaseModel):
    """Base of an executor's ``executor_options`` schema: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class StageExecutor(ABC):
    kinds: ClassVar[frozenset[str]]
    devices: ClassVar[frozenset[str]] = frozenset({"cpu"})
    input_contracts: ClassVar[frozenset[str]]
    output_contracts: ClassVar[frozenset[str]]
    Options: ClassVar[type[ExecutorOptions]] = ExecutorOptions
    requires_model: ClassVar[bool] = False  # the stage must set model:
    # The keys ``submit`` takes from a request's entry of sampling_params_list, or None where it declares none (it
    # gets an entry's every field). A parameter object (vLLM's SamplingParams, say) is cut to these; a dict is sent
    # whole, so a misspelt key is an error, not a silently ignored setting.
    param_names: ClassVar[frozenset[str] | None] = None

    @classmethod
    def options(cls, stage: StageConfig) -> Any:
        return cls.Options.model_validate(stage.executor_options)

    @classmethod
    def pipeline_options(cls, stage: StageConfig, inputs: frozenset[str]) -> dict[str, Any]:
        """``executor_options`` implied by the stage's place in the pipeline: ``inputs`` are the contracts routed
        into it. Applied when the deploy config is loaded, to the options the stage does not set."""
        return {}

    @classmethod
    @abstractmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        """Memory the stage will hold, computed without loading anything."""

    @abstractmethod
    def start(self, stage: StageConfig) -> None: ...

    @abstractmethod
    def submit(self, request_id: str, params: dict[str, Any]) -> None: ...

    @abstractmethod
    def feed(self, request_id: str, payload: Payload) -> None: ...

    @abstractmethod
    def end_input(self, request_id: str) -> None: ...

    @abstractmethod
    def has_work(self) -> bool: ...

    @abstractmethod
    def step(self) -> list[StepOutput]: ...

    @abstractmethod
    def abort(self, request_id: str) -> None: ...

    def shutdown(self) -> None:
        """Release what ``start`` acquired; the process exits afterwards anyway."""


_BUILTIN = {
    "text": "edge_infer.runtime.text_executor:TextEngineExecutor",
    "media_encoder": "edge_infer.runtime.encoder_executor:MediaEncoderExecutor",
    "onnx_vocoder": "edge_infer.runtime.onnx_executor:OnnxVocoderExecutor",
    "qwen3_tts_talker": "edge_infer.tts.executors:TalkerExecutor",
    "qwen3_tts_code2wav": "edge_infer.tts.executors:Code2WavExecutor",
}
_registry: dict[str, str] = dict(_BUILTIN)


def register_executor(name: str, target: str | type[StageExecutor]) -> None:
    """Make ``executor: name`` usable in deploy configs.

    ``target`` is ``"package.module:ClassName"`` or the class itself (it must be
    importable by that path from a fresh process).
    """
    if isinstance(target, type):
        if "<locals>" in target.__qualname__:
            raise ValueError(f"executor class {target.__qualname__} is local to a function; define it at module level")
        target = f"{target.__module__}:{target.__qualname__}"
    if ":" not in target:
        raise ValueError(f"executor target {target!r} must look like 'package.module:ClassName'")
    _registry[name] = target


def registered_executors() -> list[str]:
    return sorted(_registry)


def executor_target(name: str) -> str:
    try:
        return _registry[name]
    except KeyError:
        raise KeyError(f"no executor named {name!r}; registered: {', '.join(registered_executors())}") from None


def load_executor(target: str) -> type[StageExecutor]:
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, StageExecutor)):
        raise TypeError(f"{target} is not a StageExecutor subclass")
    return obj
