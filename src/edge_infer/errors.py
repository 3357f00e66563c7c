"""Exceptions users see. Each message names what is wrong and how to fix it."""
from __future__ import annotations


class EdgeInferError(Exception):
    """Base class for errors edge-infer raises on purpose."""


class CheckpointError(EdgeInferError, ValueError):
    """A checkpoint directory is missing, malformed or unsupported."""


class InvalidRequestError(EdgeInferError, ValueError):
    """A request's prompt or parameters cannot be served as given."""


class ContextLengthError(InvalidRequestError):
    """A request's prompt, or prompt and max_tokens, do not fit max_model_len (the server's 400 says
    ``context_length_exceeded``, as OpenAI's does, which clients such as langchain-openai act on)."""


class GrammarLimitError(InvalidRequestError):
    """A structured-output spec past llguidance's parser limits (the server's 400 says ``grammar_limit``)."""


class MediaError(InvalidRequestError):
    """A request's image, audio or video cannot be read, or is over a limit; the message names the part.

    An InvalidRequestError, so the server answers it with a 400 like any other bad request.
    """


class PlanRefusedError(EdgeInferError, RuntimeError):
    """The memory plan does not fit; carries the plan for its numbers."""

    def __init__(self, message: str, plan: object | None = None):
        super().__init__(message)
        self.plan = plan

    @property
    def summary(self) -> str:
        """One line: the plan's first reason, or the message's first line."""
        reasons = getattr(self.plan, "reasons", None)
        return f"refused: {reasons[0]}" if reasons else str(self).splitlines()[0]


class StaleSessionError(EdgeInferError, RuntimeError):
    """A session handle that was closed (or belongs to another engine)."""


class KernelUnavailableError(EdgeInferError, RuntimeError):
    """A weight kernel cannot run on this machine (a CPU feature, a compiler or a library is missing)."""


class EngineLoadError(EdgeInferError, RuntimeError):
    """The engine core failed while loading for a reason with no type of its own (its message says which)."""


class EngineDeadError(EdgeInferError, RuntimeError):
    """The engine worker process is gone; the engine must be restarted."""
