"""Every failure leaves the server as an OpenAI error object with the right status.

``{"error": {"message", "type", "param", "code"}}``. Request validation
(FastAPI answers 422 by default) is a 400 here, as OpenAI clients expect.
Engine errors keep their meaning: a bad request is a 400, a dead worker a 503.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from typing import Any, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edge_infer.errors import ContextLengthError, EngineDeadError, GrammarLimitError, InvalidRequestError, MediaError
from edge_infer.server.protocol import PROMPT_FORMS, ErrorInfo, ErrorResponse

log = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}
# Validation errors listed in one message; the rest are counted.
MAX_LISTED_ERRORS = 3


class APIError(Exception):
    """An error to answer with; raised anywhere in request handling."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def info(self) -> ErrorInfo:
        return ErrorInfo(message=self.message, type=ERROR_TYPES.get(self.status, "server_error"), param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorResponse(error=self.info()).model_dump(), status_code=self.status, headers=self.headers)


def from_exception(exc: Exception) -> APIError:
    """The API error for an engine exception met while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, MediaError):  # an image, audio or video part that cannot be read, or over a limit
        return APIError(400, str(exc), code="invalid_media")
    if isinstance(exc, ContextLengthError):
        return APIError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, GrammarLimitError):
        return APIError(400, str(exc), code="grammar_limit")
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), code="invalid_request")
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"the engine worker is down ({exc}); the server restarts it unless --no-restart is set: "
                             "retry shortly", code="engine_dead")
    log.exception("unexpected error while serving a request", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


# How pydantic names the member of a union it tried, in an error's location: a type (a model's class name among
# them), not a field (the protocol's fields are snake_case).
_MEMBER = re.compile(r"^(constrained-)?(str|int|float|bool|none|bytes)$|\[|^[A-Z][A-Za-z0-9]*$")


def _member(part: Any) -> bool:
    return isinstance(part, str) and bool(_MEMBER.search(part))


def _loc(loc: Sequence[Any]) -> str:
    # pydantic names the member of a union it tried ("list[tagged-union[TextPart,ImagePart,...]]", the prompt's
    # form): not a field
    parts: list[str] = []
    for p in map(str, loc):
        if p != "body" and not _member(p) and not (parts[-1:] == ["prompt"] and p in PROMPT_FORMS):
            parts.append(p)
    return ".".join(parts)


def _without_union_noise(errors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop a union member refused on its type alone while another member got further into the value: content that
    is a list of parts with one bad part is not also "not a string", 17 stop strings are not "not a string" either;
    a value no member takes is one error naming them all ("a valid string or a valid list"). A field's own type
    error stays (it went missing beside a bad union elsewhere). Linear in the errors (a body of many bad items
    must not cost seconds here)."""
    further = defaultdict(set)  # a union's location -> its members refused on more than their type
    for err in errors:
        loc = tuple(err.get("loc", ()))
        on_type = str(err.get("type", "")).endswith("_type")
        for k in range(1, len(loc)):
            if _member(loc[k]) and not (on_type and k == len(loc) - 1):
                further[loc[:k]].add(loc[k])

    def on_member_type(err: dict[str, Any]) -> bool:
        loc = tuple(err.get("loc", ()))
        return str(err.get("type", "")).endswith("_type") and len(loc) > 1 and _member(loc[-1])

    def noise(err: dict[str, Any]) -> bool:  # a field's own type error is never noise, whatever else is wrong
        return on_member_type(err) and bool(further[tuple(err["loc"][:-1])] - {err["loc"][-1]})

    kept, merged = [], {}
    for err in errors:
        if noise(err):
            continue
        if on_member_type(err):  # every member refused on its type: one error at the union's location
            union = tuple(err["loc"][:-1])
            if union in merged:
                merged[union]["msg"] += " or " + str(err.get("msg", "")).removeprefix("Input should be ")
                continue
            err = merged[union] = {**err, "loc": union}
        kept.append(err)
    return kept


UNPARSED_BODY = "There was an error parsing the body"  # FastAPI's words (fastapi.routing)


def validation_error(errors: Sequence[dict[str, Any]]) -> APIError:
    if errors and errors[0].get("type") == "json_invalid":
        # FastAPI puts the character offset where a field name belongs.
        ctx = errors[0].get("ctx") or {}
        offset = errors[0].get("loc", ("body", "?"))[-1]
        return APIError(400, f"the request body is not valid JSON ({ctx.get('error', 'decode error')} at character {offset})",
                        code="invalid_json")
    if errors and errors[0].get("type") == "missing" and tuple(errors[0].get("loc", ())) == ("body",):
        return APIError(400, "the request body is empty; send a JSON object", code="invalid_json")
    errors = _without_union_noise(errors) or errors
    lines = []
    for err in errors[:MAX_LISTED_ERRORS]:
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        where = _loc(err.get("loc", ()))
        lines.append(f"{where}: {msg}" if where else msg)
    if len(errors) > MAX_LISTED_ERRORS:
        lines.append(f"(and {len(errors) - MAX_LISTED_ERRORS} more)")
    param = _loc(errors[0].get("loc", ())) if errors else None
    return APIError(400, "; ".join(lines), param=param or None, code="invalid_parameter")


def _routing_error(app: FastAPI, request: Request, exc: StarletteHTTPException) -> APIError | None:
    """Starlette's bare "Not Found" and "Method Not Allowed" as errors naming the path or method and what is
    served: a client pointed at a route this server lacks (/v1/embeddings) learnt nothing from them."""
    path, method = request.url.path, request.method
    if exc.status_code == 404 and exc.detail == "Not Found":
        try:
            served = "; this server serves " + ", ".join(sorted(app.openapi()["paths"]))  # built once, then cached
        except Exception:  # the listing is a courtesy: never a 500 in its place
            served = ""
        return APIError(404, f"{path} is not served here{served}", code="unknown_route")
    if exc.status_code == 405 and exc.detail == "Method Not Allowed":
        allowed = (exc.headers or {}).get("Allow", "")
        return APIError(405, f"{path} takes {allowed or 'other methods'}, not {method}", code="method_not_allowed",
                        headers=exc.headers)
    return None


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = getattr(exc, "error", None) or _routing_error(app, request, exc)  # http.BodyRefused carries its own
        if error is None and exc.status_code == 400 and exc.detail == UNPARSED_BODY:
            # what FastAPI says of a body json.loads raised on with something else than a syntax error
            error = APIError(400, "the request body could not be read as JSON: it is not UTF-8 text, or it nests "
                                  "deeper than the JSON parser goes (about 1,000 levels)", code="invalid_json")
        if error is None:
            error = APIError(exc.status_code, str(exc.detail), code="body_too_large" if exc.status_code == 413 else None,
                             headers=getattr(exc, "headers", None))
        return error.response()

    async def _engine_error(_: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()

    # Any other exception reaches http.CatchAll, which answers 500 without dropping the connection.
    for cls in (InvalidRequestError, EngineDeadError):
        app.add_exception_handler(cls, _engine_error)
