"""Server-sent events in OpenAI's framing: ``data: {json}`` lines, an error object, ``data: [DONE]``."""
from __future__ import annotations

from pydantic import BaseModel

from edge_infer.server.errors import APIError
from edge_infer.server.protocol import ErrorResponse

MEDIA_TYPE = "text/event-stream"
# Proxies must pass chunks through as they come.
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json(exclude_none=True)}\n\n"


def sse_error(error: APIError) -> str:
    """An error after the stream began: OpenAI clients raise it when they read it."""
    return sse(ErrorResponse(error=error.info()))


def sse_done() -> str:
    return "data: [DONE]\n\n"
