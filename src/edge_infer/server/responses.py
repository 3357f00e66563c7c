"""The error and streaming responses every route documents in the OpenAPI schema."""
from __future__ import annotations

from typing import Any

from edge_infer.server.protocol import ErrorResponse
from edge_infer.server.streaming import MEDIA_TYPE

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "invalid parameters, input or prompt (one that does not fit max_model_len included)",
        401: "missing or wrong API key (when the server has one)",
        404: "the model is not served here (model_not_found)",
        413: "the request body is larger than --max-body-bytes",
        429: "admission queue full; see the Retry-After header",
        500: "an unexpected failure (the message names it)",
        503: "loading, shutting down, or the engine (a worker or pipeline stage) is down",
    }.items()
}
STREAM_RESPONSE = {"content": {MEDIA_TYPE: {"schema": {"type": "string"}}}, "description": "with stream=true: server-sent events"}
