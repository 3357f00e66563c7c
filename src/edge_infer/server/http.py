"""The HTTP pieces under every route: middlewares, the API-key check, streamed responses, disconnects.

``base_app`` builds a FastAPI app that loads the served models in the
background and closes them at exit, with OpenAI-shaped error handlers,
request counting, an ``x-request-id`` on every response, the API key (401
before a body is read), the body limits (size 413, in flight 429, time 408)
and format (JSON, uncompressed: 415), and a catch-all that turns any
unexpected error into a well-formed 500;
``EventStream`` is a streamed response that releases its requests however
the response ends; ``unless_disconnected`` races work against the client
going away.
"""
from __future__ import annotations

import asyncio
import logging
import re
import secrets
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from edge_infer.errors import EdgeInferError
from edge_infer.server.errors import APIError, install_handlers
from edge_infer.server.service import RETRY_AFTER_S
from edge_infer.server.streaming import HEADERS, MEDIA_TYPE

# The status nginx logs for a client that closed the connection first; nobody reads the body.
CLIENT_CLOSED = 499
# On a refusal before the body's end: the rest of the body is not read, and the client starts afresh.
CLOSE = {"Connection": "close"}
log = logging.getLogger(__name__)


class _NotedSend:
    """An ASGI ``send`` that notes the response's status once it has started."""

    def __init__(self, send: Callable):
        self.send = send
        self.status: int | None = None

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


async def _send_error(send: Callable, error: APIError) -> None:
    response = error.response()
    await response({"type": "http"}, None, send)


class BrokenStream(Exception):
    """Raised to the HTTP server when a response's body has begun and cannot be finished: uvicorn then closes the
    connection without the body's end, so the client sees a cut transfer (no last chunk, or fewer bytes than
    announced), not a short response that looks complete (a wav stream whose stage died)."""


class _QuietBrokenStream(logging.Filter):
    """uvicorn logs an exception the app raises with its traceback; CatchAll has logged what broke the stream."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], BrokenStream))


_QUIET_BROKEN_STREAM = _QuietBrokenStream()


# A request id the client chose is echoed when it is short and plain (it goes into logs and headers as it is).
CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(scope: dict) -> str:
    """The id RequestId gave this request (for log lines), or "-" outside it."""
    return scope.get("edge_infer.request_id", "-")


class RequestId:
    """ASGI middleware: every response carries ``x-request-id``, as OpenAI's do (the openai client shows it as a
    response's ``_request_id`` and an error's ``request_id``), and the server's log lines about the request name
    it. It is the client's own ``X-Request-Id`` when that is short and plain (a gateway's or a tracer's id), or a
    new ``req_`` id."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = given if CLIENT_REQUEST_ID.fullmatch(given) else f"req_{secrets.token_hex(16)}"
        header = (b"x-request-id", rid.encode())

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await self.app({**scope, "edge_infer.request_id": rid}, receive, send_with_id)


class CatchAll:
    """ASGI middleware: an exception nothing else handled becomes a 500 in the OpenAI shape, sent as a
    normal response, so the connection stays usable (keep-alive) and the status is counted as 500. Once the
    body has begun, the stream is cut instead (BrokenStream).

    (Starlette's own last-resort handler answers, then re-raises, and the server drops the connection.)
    """

    def __init__(self, app: Any):
        self.app = app
        logging.getLogger("uvicorn.error").addFilter(_QUIET_BROKEN_STREAM)  # once: the same filter is not added twice

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        noted = _NotedSend(send)
        try:
            await self.app(scope, receive, noted)
        except Exception as exc:
            if noted.status is None:
                log.exception("unexpected error serving %s %s (%s)", scope.get("method"), scope.get("path"),
                              request_id(scope), exc_info=exc)
                await _send_error(send, APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error"))
                return
            # Mid-body. Starlette wraps an error its handlers know ("Caught handled exception, but response already
            # started"): name the error itself, with a traceback only when it is not one edge-infer raises on purpose.
            cause = exc.__cause__ if isinstance(exc, RuntimeError) and exc.__cause__ is not None else exc
            log.error("%s %s (%s): the response was cut mid-body (%s: %s)", scope.get("method"), scope.get("path"),
                      request_id(scope), type(cause).__name__, cause,
                      exc_info=None if isinstance(cause, EdgeInferError) else cause)
            raise BrokenStream(str(cause)) from exc


class BodyRefused(StarletteHTTPException):
    """Raised from ``receive`` mid-body (over the size limit, or past the budget of bodies in flight); an
    HTTPException so that FastAPI's body parsing passes it on (it turns other exceptions into a 400) and the
    handlers answer with its ``error``."""

    def __init__(self, error: APIError):
        super().__init__(error.status, error.message, headers=error.headers)
        self.error = error


@dataclass(frozen=True)
class BodyCost:
    """What the server process holds for a request body, in bytes of body: its own, plus each JSON object and
    each other item at what it parses to beyond its bytes (``[{},{},…]`` is 3 bytes per object, ~100 parsed).
    Measured by scripts/measure_overhead.py --bodies (memory/overhead.json)."""

    per_object: float
    per_item: float

    @classmethod
    def measured(cls) -> "BodyCost":
        from edge_infer.memory.sizing import runtime_overhead

        overhead = runtime_overhead()
        per_byte = overhead["server_bytes_per_body_byte"]
        return cls(overhead["server_bytes_per_body_object"] / per_byte, overhead["server_bytes_per_body_item"] / per_byte)

    def of(self, chunk: bytes) -> tuple[int, int]:
        """The chunk's JSON items (an upper bound: every value past the first of its container follows a comma,
        every container opens with a bracket; those in strings count too) and its cost."""
        objects = chunk.count(b"{")
        items = objects + chunk.count(b"[") + chunk.count(b",")
        return items, len(chunk) + int(self.per_object * objects + self.per_item * (items - objects))


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 — at once when Content-Length says so,
    otherwise as soon as the bytes received pass the limit — and is never read further. So does one of more
    than ``max_items`` JSON items: each parses to ~100 bytes however few spell it, and the request's item counts
    (server/protocol.py) can only be checked once it is parsed.

    The bodies the requests in flight have received are held (raw and parsed) until their responses end: a
    request gets 429 when its Content-Length would take them past ``max_in_flight``, before its body is read,
    or as soon as its cost (``cost``: bytes, with its JSON items at what they parse to) does, so that they stay
    within the memory plan's "request bodies" item. Counted as the bytes arrive: a client that announces a large
    body and stalls holds none; a body whose cost alone passes ``max_bytes`` gets 413.

    A body must have arrived ``timeout_s`` after its request's head, or the request gets 408: a client that
    trickles a body holds its connection and what it has sent until then, not for good. Every refusal closes the
    connection, so that a body still arriving after it is not read (and waited for) in vain."""

    def __init__(self, app: Any, max_bytes: int, max_in_flight: int, max_items: int, cost: BodyCost, timeout_s: float):
        self.app = app
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight
        self.max_items = max_items
        self.cost = cost
        self.timeout_s = timeout_s
        self.in_flight = 0

    def _too_large(self, size: str) -> APIError:
        return APIError(413, f"the request body {size}; this server accepts at most {self.max_bytes:,} bytes "
                        "(--max-body-bytes)", code="body_too_large", headers=CLOSE)

    def _too_many_items(self) -> APIError:
        return APIError(413, f"the request body holds more than {self.max_items:,} JSON items (commas and brackets, in "
                        "strings too); this server parses at most that many per request (--max-body-items)",
                        code="body_too_large", headers=CLOSE)

    def _over_budget(self, size: str) -> APIError:
        return APIError(429, f"the requests in flight hold {self.in_flight:,} bytes of bodies (JSON items counted as "
                        f"the bytes they parse to); this one's {size} "
                        f"would pass --max-body-bytes-in-flight ({self.max_in_flight:,}); retry after {RETRY_AFTER_S} s",
                        code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S), **CLOSE})

    def _too_slow(self, size: int) -> APIError:
        return APIError(408, f"the request body had not arrived {self.timeout_s:g} s after the request's head "
                        f"({size:,} bytes so far); this server waits at most that long for a body (--body-timeout-s)",
                        code="body_timeout", headers=CLOSE)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        announced = int(length) if length is not None and length.isdigit() else 0
        if announced > self.max_bytes:
            await _send_error(send, self._too_large(f"is {announced:,} bytes"))
            return
        if announced and self.in_flight + announced > self.max_in_flight:
            await _send_error(send, self._over_budget(f"{announced:,} bytes"))
            return
        items = cost = size = 0  # the body's so far
        arrived = False
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        noted = _NotedSend(send)

        async def limited_receive() -> dict:
            nonlocal items, cost, size, arrived
            if arrived:  # later calls wait for the client to leave: no deadline
                return await receive()
            # Not wait_for: on Python 3.11 it gives up on a timeout <= 0 before receive() runs, data waiting or not.
            task = asyncio.ensure_future(receive())
            try:
                done, _ = await asyncio.wait({task}, timeout=max(deadline - asyncio.get_running_loop().time(), 0))
            except asyncio.CancelledError:
                task.cancel()
                raise
            if not done:
                task.cancel()
                raise BodyRefused(self._too_slow(size))
            message = task.result()
            if message["type"] == "http.request":
                arrived = not message.get("more_body", False)
                chunk = message.get("body", b"")
                chunk_items, chunk_cost = self.cost.of(chunk)
                items, cost, size = items + chunk_items, cost + chunk_cost, size + len(chunk)
                self.in_flight += chunk_cost
                if cost > self.max_bytes:
                    raise BodyRefused(self._too_large(
                        f"counts as over {self.max_bytes:,} bytes: {size:,} bytes so far, its {items:,} JSON items "
                        "counted as the bytes they parse to"))
                if items > self.max_items:
                    raise BodyRefused(self._too_many_items())
                if self.in_flight > self.max_in_flight:
                    raise BodyRefused(self._over_budget(f"{cost:,} bytes so far"))
            return message

        try:
            await self.app(scope, limited_receive, noted)
        except BodyRefused as exc:  # raised where no handler saw it
            if noted.status is None:
                await _send_error(send, exc.error)
        finally:
            self.in_flight -= cost


class BodyFormat:
    """Refuse a body the routes would misread, with what to send instead (415): one in another media type than
    JSON (curl's -d sends a form), or compressed (Content-Encoding: the routes read bytes as they come)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = dict(scope.get("headers") or [])
            encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
            kind = headers.get(b"content-type", b"application/json").decode("latin-1").partition(";")[0].strip().lower()
            if b"content-type" not in headers:  # requests.post(url, data=...) sends none: read the body as JSON
                scope = {**scope, "headers": [*(scope.get("headers") or []), (b"content-type", b"application/json")]}
            if encoding != "identity":
                await _send_error(send, APIError(415, f"the body is sent with Content-Encoding: {encoding[:40]}, which "
                                                 "edge-infer does not decode; send it uncompressed",
                                                 code="unsupported_encoding", headers=CLOSE))
                return
            if kind != "application/json" and not kind.endswith("+json"):
                await _send_error(send, APIError(415, f"the body is sent as {kind[:60] or 'no type'}; send JSON with "
                                                 "Content-Type: application/json", code="unsupported_media_type",
                                                 headers=CLOSE))
                return
        await self.app(scope, receive, send)


class RequestCounter:
    """ASGI middleware counting responses by path and status (it never touches the body)."""

    def __init__(self, app: Any, metrics: Any):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        noted = _NotedSend(send)
        try:
            await self.app(scope, receive, noted)
        finally:
            self.metrics.count_request(scope["path"], CLIENT_CLOSED if noted.status is None else noted.status)


class EventStream(StreamingResponse):
    """A streamed response (SSE unless told otherwise) that ends its generation however the response ends.

    A client can leave before the body is iterated at all; the body's own
    ``finally`` would then never run, and its engine requests would hold
    their admission and KV blocks.
    """

    def __init__(self, content: AsyncIterator[str | bytes], on_close: Callable[[], None], media_type: str = MEDIA_TYPE):
        super().__init__(content, media_type=media_type, headers=HEADERS)
        self.on_close = on_close

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def api_key_problem(api_key: str | None, authorization: str | None) -> APIError | None:
    """The 401 for a request whose ``Authorization`` header does not carry ``api_key`` (None: no key is needed)."""
    if api_key is None:
        return None
    challenge = {"WWW-Authenticate": "Bearer"}
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return APIError(401, "this server needs an API key: send 'Authorization: Bearer KEY'", code="missing_api_key",
                        headers=challenge)
    if not secrets.compare_digest(given.strip().encode(), api_key.encode()):
        return APIError(401, "the API key is wrong", code="invalid_api_key", headers=challenge)
    return None


class ApiKey:
    """ASGI middleware: the API routes (/v1/...) answer 401 before a body is read, checked or parsed, so a client
    without the key cannot spend the budget of bodies in flight or the parser's time (FastAPI reads and parses a
    body before a route's dependencies run)."""

    def __init__(self, app: Any, api_key: str | None):
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if self.api_key is not None and scope["type"] == "http" and scope["path"].startswith("/v1/"):
            header = dict(scope.get("headers") or []).get(b"authorization")
            if (error := api_key_problem(self.api_key, None if header is None else header.decode("latin-1"))):
                await _send_error(send, error)
                return
        await self.app(scope, receive, send)


def api_key_check(api_key: str | None) -> Callable[..., None]:
    """The routes' dependency on the key: what the OpenAPI document shows (ApiKey has refused a request without it)."""
    bearer = HTTPBearer(auto_error=False, description="the server's --api-key, when it has one")

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # no thread hop
        given = None if credentials is None else f"{credentials.scheme} {credentials.credentials}"
        if (error := api_key_problem(api_key, given)) is not None:
            raise error

    return check


class ClientGone(Exception):
    """The client disconnected before the work was done (the work was cancelled)."""


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s result, or ClientGone (with ``work`` cancelled) if the client leaves first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            raise ClientGone
        return task.result()
    finally:  # the client left, or this handler itself was cancelled (shutdown): the work is not wanted
        task.cancel()
        watch.cancel()


def base_app(services: Sequence[Any], metrics: Any, loader: Callable[[], Awaitable[None]] | None = None):
    """A FastAPI app that loads ``services`` in the background and closes them at exit.

    The API key, body limit and grace period are server-wide: the first service's settings hold them.
    Returns the app and the route dependencies that check the API key.
    """
    from edge_infer import __version__

    async def load_all() -> None:
        await asyncio.gather(*(s.load() for s in services))

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        loading = asyncio.create_task((loader or load_all)())
        try:
            yield
        finally:
            # A worker still loading is closed once it is up: stopping it mid-load would orphan it.
            with suppress(Exception):
                await loading
            for service in services:
                await service.close()

    settings = services[0].settings
    app = FastAPI(title="edge-infer", version=__version__, lifespan=lifespan)
    install_handlers(app)
    # Outermost last: the counter sees every status, the 413s and the catch-all's 500s included; every one has an id.
    app.add_middleware(CatchAll)
    app.add_middleware(BodyFormat)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, max_in_flight=settings.bodies_in_flight,
                       max_items=settings.max_body_items, cost=BodyCost.measured(), timeout_s=settings.body_timeout_s)
    app.add_middleware(ApiKey, api_key=settings.api_key)
    app.add_middleware(RequestCounter, metrics=metrics)
    app.add_middleware(RequestId)
    return app, [Depends(api_key_check(settings.api_key))]
